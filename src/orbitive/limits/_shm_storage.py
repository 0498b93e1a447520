"""``shm://``: the sync storage of ``limits`` over the fleet's rate-limit table.

:class:`ShmStorage` checks its arguments (:func:`checked_key` and the others) and
runs one table step each (``_table.RateTable``); the asyncio form
(``_shm_storage_async``) delegates every step to one. A process opens one table per
(fleet, geometry) (:func:`table_for`), shared by its storages, sync and asyncio.
"""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Final

from limits.storage.base import (
    MovingWindowSupport,
    SlidingWindowCounterSupport,
    Storage,
    TimestampedSlidingWindow,
)

from .._core._errors import AccessDenied, FleetError, LayoutMismatch, OrbitError, shown
from .._core._fleet import Fleet
from ._errors import (
    InvalidRateAmount,
    InvalidRateExpiry,
    InvalidRateKey,
    InvalidRateStorageUrl,
    RateTableFull,
    WindowTooLarge,
)
from ._layout import Geometry, parse_url
from ._table import Keys, RateTable

#: What ``limits`` may wrap in its ``StorageError`` (``wrap_exceptions=True``): the
#: table failing, never a caller's bad argument.
STORAGE_ERRORS: Final = (RateTableFull, FleetError, LayoutMismatch, AccessDenied)

#: This process's fleets (one node each) and tables, by fleet name and geometry.
_fleets: dict[str, Fleet] = {}
_tables: dict[tuple[str, Geometry], RateTable] = {}
_tables_mutex = threading.Lock()


def table_for(url: object, options: dict[str, object]) -> RateTable:
    """This process's table of the storage URL ``url`` (opened once per fleet and geometry).

    The process joins the fleet once (``Fleet.join``, one node, the fleet's capacity),
    as the ``shm://`` lock store does: while it is a member, ``orbit clear`` leaves the
    fleet's objects alone.

    Raises:
        InvalidRateStorageUrl: a URL :func:`~._layout.parse_url` refuses, or any keyword
            option (every option goes in the URL).
        LayoutMismatch: the fleet's table has another geometry, version or checksum.
        AccessDenied: the object is not this user's own.
        ShmFull: no room in ``/dev/shm`` for a new table.
        FleetError: every node of the fleet is held by a live process.
    """
    name, geometry = parse_url(url)
    if options:
        raise InvalidRateStorageUrl(
            f"rate-limit storage {url!r} takes no keyword options, got "
            f"{', '.join(sorted(options))}; its options go in the URL: capacity, windows, window"
        )
    with _tables_mutex:
        table = _tables.get((name, geometry))
        if table is None:
            fleet = _fleets.get(name)
            if fleet is None:
                fleet = _fleets[name] = Fleet.join(name)
            table = _tables[(name, geometry)] = RateTable(fleet, geometry)
        return table


def close_tables() -> None:
    """Close this process's tables and leave their fleets (tests; a process that is done)."""
    with _tables_mutex:
        for fleet in _fleets.values():
            fleet.close()
        _fleets.clear()
        _tables.clear()


def checked_key(key: object) -> str:
    """``key`` if it is a ``str`` (any length: the table keeps its digest).

    Raises:
        InvalidRateKey: any other type.
    """
    if type(key) is str:
        return key
    if not isinstance(key, str):
        raise InvalidRateKey(
            f"a rate-limit key must be a str, got {type(key).__name__}: {shown(key)}"
        )
    return str.__str__(key)  # a subclass's text as a plain str: its hooks play no part


def checked_amount(amount: object, what: str = "amount") -> int:
    """``amount`` if it is an ``int`` of at least 1 (a ``limit``: of at least 0).

    Raises:
        InvalidRateAmount: a bool, another type, or a smaller value.
    """
    low = 0 if what == "limit" else 1
    if type(amount) is not int or amount < low:
        raise InvalidRateAmount(
            f"a rate-limit {what} must be an int of at least {low}, got {shown(amount)}"
        )
    return amount


def checked_expiry(expiry: object) -> float:
    """``expiry`` (seconds) if it is a finite int or float above 0.

    Raises:
        InvalidRateExpiry: a bool, another type, 0 or less, NaN or infinite.
    """
    seconds = -1.0
    if type(expiry) is float or type(expiry) is int:
        with contextlib.suppress(OverflowError):  # an int beyond any float stays refused
            seconds = float(expiry)
    if not 0.0 < seconds < math.inf:
        raise InvalidRateExpiry(
            f"a rate-limit expiry must be a finite number of seconds above 0, got {shown(expiry)}"
        )
    return seconds


def checked_window(table: RateTable, limit: object, amount: object) -> tuple[int, int]:
    """``(limit, amount)`` of a moving-window call: ints, and the limit within the window.

    Raises:
        InvalidRateAmount: as :func:`checked_amount`.
        WindowTooLarge: the limit is above the table's ``window``.
    """
    limit, amount = checked_amount(limit, "limit"), checked_amount(amount)
    window = table.geometry.window
    if limit > window:
        raise WindowTooLarge(
            f"moving-window limit {limit} is above the {window} timestamps a window slot of "
            f"fleet {table.fleet!r} holds; give the storage URL window={limit} or more "
            f"(shm://{table.fleet}?window={limit}), or use a smaller limit",
            fleet=table.fleet,
        )
    return limit, amount


def sliding_keys(storage: TimestampedSlidingWindow, key: str, expiry: float) -> Keys:
    """The function of a time naming ``key``'s previous and current sliding-window
    counters at it (``limits``' own naming, so both storages name them alike)."""

    def keys(now: float) -> tuple[str, str]:
        return storage.sliding_window_keys(key, expiry, now)  # type: ignore[arg-type]

    return keys


def healthy(table: RateTable) -> bool:
    """Whether the table answers: its section can be entered and its journal is sane."""
    try:
        with table.region:
            table.recover()
    except OrbitError:
        return False
    return True


class ShmStorage(
    Storage, MovingWindowSupport, SlidingWindowCounterSupport, TimestampedSlidingWindow
):
    """Rate-limit storage in the shared memory of a fleet: one exact count per key for
    every process of the host that names the same URL.

    ``shm://FLEET?capacity=1024&windows=256&window=128`` (every option may be left out:
    these are the defaults, ``windows`` is ``capacity // 4``): ``capacity`` counter
    entries (fixed window; a sliding-window key takes two), ``windows`` moving-window
    keys, and ``window`` timestamps per moving-window key, the largest moving-window
    limit. The table is made by the first process and has that size for good; keys of
    any length are kept as their BLAKE2b-128 digest. Times are epoch seconds (``float``).

    Args:
        uri: the storage URL, ``shm://FLEET[?options]``.
        wrap_exceptions: wrap the table's failures (:data:`STORAGE_ERRORS`) in
            ``limits.errors.StorageError``.
        options: none is taken (they go in the URL).

    Raises:
        InvalidRateStorageUrl: a malformed URL, an unknown or bad option, any keyword option.
        LayoutMismatch: the fleet's table was made with other options, or is corrupt.
        AccessDenied: the table is not this user's own (owner, mode, symlink).
        ShmFull: no room in ``/dev/shm`` for a new table.
        FleetError: every node of the fleet is held by a live process (the process
            joins the fleet once, as the ``shm://`` lock store does).
    """

    STORAGE_SCHEME = ["shm"]  # noqa: RUF012 - limits registers a list of schemes

    def __init__(
        self, uri: str, wrap_exceptions: bool = False, **options: float | str | bool
    ) -> None:
        self.table = table_for(uri, dict(options))
        super().__init__(uri, wrap_exceptions=wrap_exceptions)

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        """The errors ``wrap_exceptions`` wraps: the table's failures, never bad arguments."""
        return STORAGE_ERRORS

    def incr(self, key: str, expiry: float, amount: int = 1) -> int:
        """Add ``amount`` to ``key``'s counter; a new counter expires ``expiry`` seconds
        from now (an existing one keeps its expiry).

        Args:
            key: the rate-limit key (``str``).
            expiry: seconds (``int`` or ``float`` above 0).
            amount: an ``int`` of at least 1.

        Returns:
            The counter after the addition (``int``).

        Raises:
            InvalidRateKey, InvalidRateExpiry, InvalidRateAmount: a bad argument.
            RateTableFull: a new key finds no free entry near its home (nothing counted).
            FleetError: the table is closed.
        """
        return self.table.incr(checked_key(key), checked_expiry(expiry), checked_amount(amount))

    def get(self, key: str) -> int:
        """``key``'s counter (``int``), 0 when absent or expired.

        Raises:
            InvalidRateKey: ``key`` is not a ``str``.
        """
        return self.table.get(checked_key(key))

    def get_expiry(self, key: str) -> float:
        """When ``key``'s counter expires, epoch seconds (``float``); now when it has none.

        Raises:
            InvalidRateKey: ``key`` is not a ``str``.
        """
        return self.table.get_expiry(checked_key(key))

    def check(self) -> bool:
        """Whether the table can be used (its critical section can be entered)."""
        return healthy(self.table)

    def reset(self) -> int:
        """Forget every counter and moving window of the table (every process's).

        Returns:
            How many counters and windows were live (``int``).
        """
        return self.table.reset()

    def clear(self, key: str) -> None:
        """Forget ``key``'s counter and its moving window.

        Raises:
            InvalidRateKey: ``key`` is not a ``str``.
        """
        self.table.clear(checked_key(key))

    def acquire_entry(self, key: str, limit: int, expiry: float, amount: int = 1) -> bool:
        """Take ``amount`` entries of ``key``'s moving window if fewer than ``limit -
        amount + 1`` were taken in the last ``expiry`` seconds.

        Args:
            key: the rate-limit key (``str``).
            limit: entries allowed per ``expiry`` seconds (``int``, at most the URL's ``window``).
            expiry: the window's length in seconds (above 0).
            amount: entries to take (``int`` of at least 1).

        Returns:
            True when taken; False when the window has no room (or ``amount > limit``).

        Raises:
            InvalidRateKey, InvalidRateExpiry, InvalidRateAmount: a bad argument.
            WindowTooLarge: ``limit`` is above the URL's ``window``.
            RateTableFull: a new key finds no free window slot near its home.
        """
        limit, amount = checked_window(self.table, limit, amount)
        seconds = checked_expiry(expiry)
        if amount > limit:
            return False
        return self.table.acquire_entry(checked_key(key), limit, seconds, amount)

    def get_moving_window(self, key: str, limit: int, expiry: float) -> tuple[float, int]:
        """The moving window of ``key`` now.

        Returns:
            (the oldest entry's time in the last ``expiry`` seconds, epoch seconds; how
            many entries are in them): ``(now, 0)`` when none is.

        Raises:
            InvalidRateKey, InvalidRateExpiry, InvalidRateAmount: a bad argument.
            WindowTooLarge: ``limit`` is above the URL's ``window``.
        """
        checked_window(self.table, limit, 1)
        return self.table.get_moving_window(checked_key(key), checked_expiry(expiry))

    def acquire_sliding_window_entry(
        self, key: str, limit: int, expiry: float, amount: int = 1
    ) -> bool:
        """Count ``amount`` in ``key``'s current window if the previous window's count,
        weighted by its share of the last ``expiry`` seconds, plus the current count
        leaves room; read and counted in one step.

        Args:
            key: the rate-limit key (``str``).
            limit: hits allowed per ``expiry`` seconds (``int``).
            expiry: the window's length in seconds (above 0).
            amount: an ``int`` of at least 1.

        Returns:
            True when counted; False when there is no room (or ``amount > limit``).

        Raises:
            InvalidRateKey, InvalidRateExpiry, InvalidRateAmount: a bad argument.
            RateTableFull: the current window's new counter finds no free entry.
        """
        limit, amount = checked_amount(limit, "limit"), checked_amount(amount)
        seconds = checked_expiry(expiry)
        if amount > limit:
            return False
        return self.table.acquire_sliding(
            self._keys(checked_key(key), expiry), limit, seconds, amount
        )

    def get_sliding_window(self, key: str, expiry: float) -> tuple[int, float, int, float]:
        """The two windows of ``key`` now.

        Returns:
            (previous window's count, its time to live in seconds, current window's
            count, its time to live in seconds), as ``memory://`` gives them.

        Raises:
            InvalidRateKey, InvalidRateExpiry: a bad argument.
        """
        seconds = checked_expiry(expiry)
        return self.table.sliding_window(self._keys(checked_key(key), expiry), seconds)

    def clear_sliding_window(self, key: str, expiry: float) -> None:
        """Forget the two windows of ``key``.

        Raises:
            InvalidRateKey, InvalidRateExpiry: a bad argument.
        """
        checked_expiry(expiry)
        self.table.clear_pair(self._keys(checked_key(key), expiry))

    def _keys(self, key: str, expiry: float) -> Keys:
        return sliding_keys(self, key, expiry)
