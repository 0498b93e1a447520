"""``async+shm://``: the asyncio storage of ``limits`` over the fleet's rate-limit table.

The twin of ``_shm_storage``: each coroutine delegates to a :class:`ShmStorage` of the
same URL (the same argument checks and the same table, one per process, fleet and
geometry), its step run directly in the event loop's thread: a step holds the table's
section for microseconds and never waits on I/O (a section held by a process that
died is repaired by the next locker at once).
"""

from __future__ import annotations

from limits.aio.storage.base import MovingWindowSupport, SlidingWindowCounterSupport, Storage
from limits.storage.base import TimestampedSlidingWindow

from ._shm_storage import STORAGE_ERRORS, ShmStorage


class AsyncShmStorage(
    Storage, MovingWindowSupport, SlidingWindowCounterSupport, TimestampedSlidingWindow
):
    """The asyncio form of :class:`~orbitive.limits.ShmStorage`, scheme ``async+shm://``;
    the same URL options, table, arguments, answers and errors (see it), as coroutines.

    Args:
        uri: the storage URL, ``async+shm://FLEET[?options]``.
        wrap_exceptions: wrap the table's failures in ``limits.errors.StorageError``.
        options: none is taken (they go in the URL).

    Raises:
        InvalidRateStorageUrl: a malformed URL, an unknown or bad option, any keyword option.
        LayoutMismatch: the fleet's table was made with other options, or is corrupt.
        AccessDenied: the table is not this user's own.
        ShmFull: no room in ``/dev/shm`` for a new table.
    """

    STORAGE_SCHEME = ["async+shm"]  # noqa: RUF012 - limits registers a list of schemes

    def __init__(
        self, uri: str, wrap_exceptions: bool = False, **options: float | str | bool
    ) -> None:
        self.sync = ShmStorage(uri, False, **options)  # unwrapped errors: this one wraps them
        self.table = self.sync.table
        super().__init__(uri, wrap_exceptions=wrap_exceptions)

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        """The errors ``wrap_exceptions`` wraps: the table's failures, never bad arguments."""
        return STORAGE_ERRORS

    async def incr(self, key: str, expiry: float, amount: int = 1) -> int:
        """As :meth:`ShmStorage.incr <orbitive.limits.ShmStorage.incr>`: the new counter (``int``).

        Raises:
            InvalidRateKey, InvalidRateExpiry, InvalidRateAmount: a bad argument.
            RateTableFull: a new key finds no free entry near its home (nothing counted).
        """
        return self.sync.incr(key, expiry, amount)

    async def get(self, key: str) -> int:
        """``key``'s counter (``int``), 0 when absent or expired.

        Raises:
            InvalidRateKey: ``key`` is not a ``str``.
        """
        return self.sync.get(key)

    async def get_expiry(self, key: str) -> float:
        """When ``key``'s counter expires, epoch seconds (``float``); now when it has none.

        Raises:
            InvalidRateKey: ``key`` is not a ``str``.
        """
        return self.sync.get_expiry(key)

    async def check(self) -> bool:
        """Whether the table can be used (its critical section can be entered)."""
        return self.sync.check()

    async def reset(self) -> int:
        """Forget every counter and moving window; how many were live (``int``)."""
        return self.sync.reset()

    async def clear(self, key: str) -> None:
        """Forget ``key``'s counter and its moving window.

        Raises:
            InvalidRateKey: ``key`` is not a ``str``.
        """
        self.sync.clear(key)

    async def acquire_entry(self, key: str, limit: int, expiry: float, amount: int = 1) -> bool:
        """As :meth:`ShmStorage.acquire_entry <orbitive.limits.ShmStorage.acquire_entry>`:
        True when the entries were taken.

        Raises:
            InvalidRateKey, InvalidRateExpiry, InvalidRateAmount: a bad argument.
            WindowTooLarge: ``limit`` is above the URL's ``window``.
            RateTableFull: a new key finds no free window slot near its home.
        """
        return self.sync.acquire_entry(key, limit, expiry, amount)

    async def get_moving_window(self, key: str, limit: int, expiry: float) -> tuple[float, int]:
        """(the oldest entry's time in the last ``expiry`` seconds, epoch seconds; how many
        entries are in them), ``(now, 0)`` when none is.

        Raises:
            InvalidRateKey, InvalidRateExpiry, InvalidRateAmount: a bad argument.
            WindowTooLarge: ``limit`` is above the URL's ``window``.
        """
        return self.sync.get_moving_window(key, limit, expiry)

    async def acquire_sliding_window_entry(
        self, key: str, limit: int, expiry: float, amount: int = 1
    ) -> bool:
        """As :meth:`ShmStorage.acquire_sliding_window_entry
        <orbitive.limits.ShmStorage.acquire_sliding_window_entry>`: True when counted.

        Raises:
            InvalidRateKey, InvalidRateExpiry, InvalidRateAmount: a bad argument.
            RateTableFull: the current window's new counter finds no free entry.
        """
        return self.sync.acquire_sliding_window_entry(key, limit, expiry, amount)

    async def get_sliding_window(self, key: str, expiry: float) -> tuple[int, float, int, float]:
        """(previous window's count, its time to live in seconds, current window's count,
        its time to live in seconds).

        Raises:
            InvalidRateKey, InvalidRateExpiry: a bad argument.
        """
        return self.sync.get_sliding_window(key, expiry)

    async def clear_sliding_window(self, key: str, expiry: float) -> None:
        """Forget the two windows of ``key``.

        Raises:
            InvalidRateKey, InvalidRateExpiry: a bad argument.
        """
        self.sync.clear_sliding_window(key, expiry)
