"""The asyncio form of the ``postgresql://`` storage (``async+postgresql://``).

The SQL, the schema, the checks and the answers are the sync storage's
(:mod:`._postgres_storage`, imported, not copied), so the two forms agree on every
rule by construction and share the tables: a sync and an async process limit one
key together. The statements run on the store's asyncio PostgreSQL engine
(:class:`~orbitive.store._postgres_async.PostgresAsyncEngine`): one
``psycopg.AsyncConnection`` per event loop, each call bounded by the URL's
``?timeout=S``, a broken connection replaced and the statement retried while time
is left; a statement is never abandoned half-way by a cancelled task.
"""

from __future__ import annotations

import time
from typing import Any

from limits.aio.storage.base import MovingWindowSupport, SlidingWindowCounterSupport, Storage
from limits.storage.base import TimestampedSlidingWindow

from .._core._errors import StoreError
from ..store._postgres_async import PostgresAsyncEngine
from ..store._url import _redacted
from ._postgres_storage import (
    ACQUIRE_ENTRY,
    ACQUIRE_SLIDING,
    CHECK,
    CLEAR,
    CLEAR_SLIDING,
    GET,
    GET_EXPIRY,
    INCR,
    MOVING_WINDOW,
    RESET,
    SCHEMA,
    SCHEMES,
    SLIDING_WINDOW,
    SWEEP,
    SWEEP_EVERY_S,
    ClosedWhenDropped,
    checked_count,
    checked_expiry,
    checked_key,
    hit_params,
    moving_window,
    open_engine,
    parse_url,
    sliding_window,
)

#: The URL schemes of the asyncio storage.
ASYNC_SCHEMES = tuple(f"async+{scheme}" for scheme in SCHEMES)


class AsyncPostgresStorage(
    Storage,
    MovingWindowSupport,
    SlidingWindowCounterSupport,
    TimestampedSlidingWindow,
    ClosedWhenDropped,
):
    """Rate-limit counters in PostgreSQL for ``limits.aio`` (``async+postgresql://``):
    the same tables, statements and rules as :class:`~._postgres_storage.PostgresStorage`,
    through ``psycopg.AsyncConnection``; no method blocks the event loop.

    Args:
        uri: ``async+postgresql://user:password@host:port/db`` (or ``async+postgres://``):
            any libpq URI after the ``async+``, with its query parameters, and
            ``?timeout=S``, the bound in seconds on every call (default 5).
        wrap_exceptions: raise ``limits.errors.StorageError`` (its cause the
            :class:`~orbitive.StoreError`) instead of the ``StoreError`` itself.
        options: none is taken; connection settings go in the URL.

    Raises:
        InvalidRateStorageUrl: ``uri`` is malformed or not an ``async+postgresql://``
            URL, or an option is given (also ``ValueError``).
        StoreError: ``UNAVAILABLE`` when psycopg is not installed.

    Every method but :meth:`check` raises ``StoreError`` (kind ``UNAVAILABLE`` when the
    server cannot be reached within the timeout, ``DATABASE`` for any other database
    error), or ``limits.errors.StorageError`` around it with ``wrap_exceptions``; the
    arguments are checked as the sync storage checks them (``TypeError``, ``ValueError``).
    """

    STORAGE_SCHEME = list(ASYNC_SCHEMES)  # noqa: RUF012 - limits reads a list

    def __init__(
        self, uri: str, wrap_exceptions: bool = False, **options: float | str | bool
    ) -> None:
        self._url = parse_url(uri, options, ASYNC_SCHEMES)
        super().__init__(uri, wrap_exceptions=wrap_exceptions)
        self._sync_engine = open_engine(self._url)  # connects only if used: never here
        self._engine = PostgresAsyncEngine(self._sync_engine)
        self._ready = False
        self._swept_at = time.monotonic()
        self._sweeping = False

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        """What the methods raise: ``StoreError``."""
        return StoreError

    async def incr(self, key: str, expiry: float, amount: int = 1) -> int:
        """As :meth:`PostgresStorage.incr <._postgres_storage.PostgresStorage.incr>`:
        the counter (int) after adding ``amount`` (int >= 1) to ``key``'s window of
        ``expiry`` seconds (float > 0).

        Raises:
            TypeError, ValueError: a bad argument. StoreError: see the class.
        """
        params = {
            "key": checked_key(key),
            "expiry": checked_expiry(expiry),
            "amount": checked_count(amount, "amount", 1),
        }
        return int((await self._write(INCR, params))[0])

    async def get(self, key: str) -> int:
        """The counter of ``key`` (int), 0 when it has no live window.

        Raises:
            TypeError, ValueError: a bad key. StoreError: see the class.
        """
        return int((await self._row(GET, {"key": checked_key(key)}))[0])

    async def get_expiry(self, key: str) -> float:
        """When the window of ``key`` ends, in Unix epoch seconds (float) of the server's
        clock; the server's time now when it has no live window.

        Raises:
            TypeError, ValueError: a bad key. StoreError: see the class.
        """
        return float((await self._row(GET_EXPIRY, {"key": checked_key(key)}))[0])

    async def clear(self, key: str) -> None:
        """Forget the fixed-window counter and the moving window of ``key``.

        Raises:
            TypeError, ValueError: a bad key. StoreError: see the class.
        """
        await self._row(CLEAR, {"key": checked_key(key)})

    async def reset(self) -> int | None:
        """Forget every key of every strategy; returns how many live keys were removed.

        Raises:
            StoreError: see the class.
        """
        return int((await self._row(RESET, None))[0])

    async def check(self) -> bool:
        """Whether the server answers (and the tables exist) within the timeout: never raises."""
        try:
            await self._row(CHECK, None)
        except StoreError:
            return False
        return True

    async def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        """Record ``amount`` (int >= 1) hits of ``key`` now if the last ``expiry`` seconds
        (float > 0) hold at most ``limit - amount`` hits; True when recorded.

        Raises:
            TypeError, ValueError: a bad argument. StoreError: see the class.
        """
        return await self._hit(ACQUIRE_ENTRY, key, limit, expiry, amount)

    async def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        """(the epoch second of the oldest hit in the last ``expiry`` seconds, or now when
        there is none; the hits in them).

        Raises:
            TypeError, ValueError: a bad argument. StoreError: see the class.
        """
        params = {"key": checked_key(key), "expiry": checked_expiry(expiry)}
        return moving_window(await self._row(MOVING_WINDOW, params))

    async def acquire_sliding_window_entry(
        self, key: str, limit: int, expiry: int, amount: int = 1
    ) -> bool:
        """Count ``amount`` (int >= 1) hits of ``key`` if the weighted count of the previous
        and current windows of ``expiry`` seconds (float > 0) stays within ``limit``;
        True when counted.

        Raises:
            TypeError, ValueError: a bad argument. StoreError: see the class.
        """
        return await self._hit(ACQUIRE_SLIDING, key, limit, expiry, amount)

    async def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        """(previous window's count, seconds until it stops weighing, current window's
        count, seconds until it is gone), as floats of seconds.

        Raises:
            TypeError, ValueError: a bad argument. StoreError: see the class.
        """
        seconds = checked_expiry(expiry)
        row = await self._row(SLIDING_WINDOW, {"key": checked_key(key)})
        return sliding_window(row, seconds)

    async def clear_sliding_window(self, key: str, expiry: int) -> None:
        """Forget the sliding window of ``key`` (``expiry`` is checked, not needed).

        Raises:
            TypeError, ValueError: a bad argument. StoreError: see the class.
        """
        checked_expiry(expiry)
        await self._row(CLEAR_SLIDING, {"key": checked_key(key)})

    def close(self) -> None:
        """Close every connection (a later call fails with ``StoreError(CLOSED)``)."""
        self._engine.close()
        self._sync_engine.close()

    async def _row(self, sql: str, params: dict[str, object] | None) -> tuple[Any, ...]:
        """The first row of one statement (an empty tuple when it returns none)."""
        if not self._ready:
            await self._engine.rows(SCHEMA, None)
            self._ready = True
        rows = await self._engine.rows(sql, params)
        return rows[0] if rows else ()

    async def _write(self, sql: str, params: dict[str, object]) -> tuple[Any, ...]:
        """:meth:`_row` for a write, followed by a sweep of expired rows once a minute."""
        row = await self._row(sql, params)
        if time.monotonic() - self._swept_at >= SWEEP_EVERY_S and not self._sweeping:
            self._sweeping = True
            try:
                self._swept_at = time.monotonic()
                await self._row(SWEEP, None)
            finally:
                self._sweeping = False
        return row

    async def _hit(self, sql: str, key: str, limit: int, expiry: float, amount: int) -> bool:
        """One acquisition (``sql``, on ``hit_params``): False without a round trip when
        ``amount`` is above ``limit``."""
        params = hit_params(key, limit, expiry, amount)
        if amount > limit:
            return False
        return bool((await self._write(sql, params))[0])

    def __repr__(self) -> str:
        return f"<AsyncPostgresStorage async+{_redacted(self._url)}>"
