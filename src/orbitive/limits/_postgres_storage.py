"""The ``postgresql://`` storage of the ``limits`` package: one exact limit for every
worker of every host, in three tables of a PostgreSQL database.

Facts this storage relies on:

* It runs on the store's PostgreSQL engine (:class:`~orbitive.store._postgres.PostgresEngine`,
  opened without the lock tables): one connection per process (per event loop for
  the asyncio form), every call bounded by the URL's ``?timeout=S`` (default 5 s),
  a broken connection replaced and the call retried once, a forked child on a
  connection of its own. The URL is checked as ``open_store`` checks it
  (:func:`~orbitive.store._url.postgres_conninfo`).
* The server's ``clock_timestamp()`` is the only clock, read *after* the key's row
  is locked: the hits of one key are timed in the order they are serialised, so
  each hit's check sees every hit timed before it, whichever host sent it.
* Each call is one round trip. The fixed window's ``incr`` is one
  ``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``: the conflicting row is locked
  before the new value is computed, so concurrent increments of one key return
  the distinct values 1, 2, 3, ...; exactly ``limit`` of them are at most the
  limit. The moving window and the sliding window counter each run one server
  function that locks the key's row (``SELECT ... FOR UPDATE``, inserting the row
  first when there is none), reads the clock, checks the limit and writes: no
  two hits of one key are checked at once.
* Moving window: one row per key holds the hits still in the window as two arrays
  (the epoch second of each hit, oldest first, and its amount); each acquisition
  drops the hits that left the window, so a row holds at most ``limit`` entries.
* Sliding window counter: one row per key holds the window index
  ``floor(epoch / expiry)`` and the counts of that window and the one before
  (``limits``' timestamp-keyed windows, as its ``memory://`` storage keeps them);
  an acquisition shifts the counts when the window moved on.
* Expired rows are reclaimed twice over: a write to a key whose row expired
  overwrites it in place, and each storage object, at most once a minute, follows a
  write with one sweep statement that deletes up to 1,000 expired rows of each table
  (oldest first, skipping rows another call holds locked; an index on
  ``expires_at`` finds them).
* ``CREATE TABLE IF NOT EXISTS`` and ``CREATE OR REPLACE FUNCTION`` are not safe
  against a concurrent creator: the schema is created by one ``DO`` block under a
  transaction-scoped advisory lock, on the first call of each storage object. A
  schema already in place at :data:`SCHEMA_VERSION` (the comment of both functions)
  is used as it is, without the lock or any ``CREATE``: a user with only ``SELECT``,
  ``INSERT``, ``UPDATE``, ``DELETE`` and ``EXECUTE`` can use tables their owner made.
* A call retried after its reply was lost (the connection broke after the commit)
  counts its hits again: a retry can only refuse more, never admit more than the
  limit.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar

from limits.storage.base import (
    MovingWindowSupport,
    SlidingWindowCounterSupport,
    Storage,
    TimestampedSlidingWindow,
)

from .._core._errors import InvalidStoreUrl, StoreError
from ..store._postgres import PostgresEngine
from ..store._url import _redacted, postgres_conninfo
from ._errors import InvalidRateStorageUrl

if TYPE_CHECKING:
    import psycopg

_T = TypeVar("_T")

#: The URL schemes of the sync storage (``limits`` registers them by ``STORAGE_SCHEME``).
SCHEMES: Final = ("postgresql", "postgres")
#: A key's longest UTF-8 form, in bytes (a B-tree entry must fit a third of a page).
KEY_MAX_BYTES: Final = 2048
#: The longest window, in seconds (about 31 years; the store's longest lease).
EXPIRY_MAX_S: Final = 1e9
#: Seconds between two sweeps of expired rows by one storage object.
SWEEP_EVERY_S: Final = 60.0
#: Most expired rows one sweep deletes from each table.
SWEEP_ROWS: Final = 1000
_SCHEMA_LOCK: Final = 0x6F72_6269_6C69_6D74  # "orbilimt": serialises schema creation only

_ACQUIRE_ENTRY_FUNCTION: Final = """
CREATE OR REPLACE FUNCTION orbitive_limits_acquire_entry(
    p_key text, p_limit bigint, p_expiry float8, p_amount bigint)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
    w record;
    t float8;
    used bigint;
    kept_at float8[];
    kept_n bigint[];
BEGIN
    LOOP  -- lock the key's row, made first when there is none
        SELECT m.at, m.n INTO w FROM orbitive_limits_moving AS m WHERE m.key = p_key FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO orbitive_limits_moving (key, at, n, expires_at)
        VALUES (p_key, '{}', '{}', '-infinity') ON CONFLICT (key) DO NOTHING;
    END LOOP;
    t := extract(epoch FROM clock_timestamp());  -- read under the row lock
    SELECT coalesce(array_agg(u.a ORDER BY u.i), '{}'), coalesce(array_agg(u.c ORDER BY u.i), '{}'),
           coalesce(sum(u.c), 0)
    INTO kept_at, kept_n, used
    FROM unnest(w.at, w.n) WITH ORDINALITY AS u(a, c, i)
    WHERE u.a > t - p_expiry;
    IF used + p_amount > p_limit THEN
        RETURN false;
    END IF;
    UPDATE orbitive_limits_moving AS m
    SET at = kept_at || t, n = kept_n || p_amount, expires_at = to_timestamp(t + p_expiry)
    WHERE m.key = p_key;
    RETURN true;
END $fn$"""
_ACQUIRE_SLIDING_FUNCTION: Final = """
CREATE OR REPLACE FUNCTION orbitive_limits_acquire_sliding(
    p_key text, p_limit bigint, p_expiry float8, p_amount bigint)
RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
    s record;
    t float8;
    v_win bigint;
    v_prev bigint;
    v_cur bigint;
BEGIN
    LOOP  -- lock the key's row, made first when there is none
        SELECT x.win, x.prev, x.cur INTO s FROM orbitive_limits_sliding AS x
        WHERE x.key = p_key FOR UPDATE;
        EXIT WHEN FOUND;
        INSERT INTO orbitive_limits_sliding (key, win, prev, cur, expires_at)
        VALUES (p_key, 0, 0, 0, '-infinity') ON CONFLICT (key) DO NOTHING;
    END LOOP;
    t := extract(epoch FROM clock_timestamp());  -- read under the row lock
    v_win := greatest(floor(t / p_expiry)::bigint, s.win);  -- a window never goes back
    v_prev := CASE v_win - s.win WHEN 0 THEN s.prev WHEN 1 THEN s.cur ELSE 0 END;
    v_cur := CASE WHEN v_win = s.win THEN s.cur ELSE 0 END;
    IF floor(v_prev * least(greatest((v_win + 1) * p_expiry - t, 0), p_expiry) / p_expiry
             + v_cur) + p_amount > p_limit THEN
        RETURN false;
    END IF;
    UPDATE orbitive_limits_sliding AS x
    SET win = v_win, prev = v_prev, cur = v_cur + p_amount,
        expires_at = to_timestamp((v_win + 2) * p_expiry)
    WHERE x.key = p_key;
    RETURN true;
END $fn$"""
#: The schema's version, kept as the comment of both functions: a schema of this version
#: in place, in the schema it would be created in (the first of the search path), is
#: used as it is (by a user who may not create anything), another one is brought up to it.
SCHEMA_VERSION: Final = "orbitive.limits schema 1"
_SCHEMA_CURRENT: Final = f"""
    to_regclass(format('%I.orbitive_limits_counters', current_schema())) IS NOT NULL
    AND to_regclass(format('%I.orbitive_limits_moving', current_schema())) IS NOT NULL
    AND to_regclass(format('%I.orbitive_limits_sliding', current_schema())) IS NOT NULL
    AND obj_description(to_regprocedure(format(
        '%I.orbitive_limits_acquire_entry(text, bigint, float8, bigint)', current_schema())),
        'pg_proc') IS NOT DISTINCT FROM '{SCHEMA_VERSION}'
    AND obj_description(to_regprocedure(format(
        '%I.orbitive_limits_acquire_sliding(text, bigint, float8, bigint)', current_schema())),
        'pg_proc') IS NOT DISTINCT FROM '{SCHEMA_VERSION}'"""
#: The whole schema as one statement (one transaction), idempotent and serialised.
SCHEMA: Final = f"""
DO $orbitive$
BEGIN
    IF {_SCHEMA_CURRENT} THEN
        RETURN;  -- in place: nothing to create, no privilege needed
    END IF;
    PERFORM pg_advisory_xact_lock({_SCHEMA_LOCK});
    CREATE TABLE IF NOT EXISTS orbitive_limits_counters (
        key text PRIMARY KEY,
        value bigint NOT NULL,
        expires_at timestamptz NOT NULL
    ) WITH (fillfactor = 50);
    CREATE INDEX IF NOT EXISTS orbitive_limits_counters_expiry
        ON orbitive_limits_counters (expires_at);
    CREATE TABLE IF NOT EXISTS orbitive_limits_moving (
        key text PRIMARY KEY,
        at float8[] NOT NULL,
        n bigint[] NOT NULL,
        expires_at timestamptz NOT NULL
    );
    CREATE INDEX IF NOT EXISTS orbitive_limits_moving_expiry ON orbitive_limits_moving (expires_at);
    CREATE TABLE IF NOT EXISTS orbitive_limits_sliding (
        key text PRIMARY KEY,
        win bigint NOT NULL,
        prev bigint NOT NULL,
        cur bigint NOT NULL,
        expires_at timestamptz NOT NULL
    ) WITH (fillfactor = 50);
    CREATE INDEX IF NOT EXISTS orbitive_limits_sliding_expiry
        ON orbitive_limits_sliding (expires_at);
    {_ACQUIRE_ENTRY_FUNCTION};
    {_ACQUIRE_SLIDING_FUNCTION};
    COMMENT ON FUNCTION orbitive_limits_acquire_entry(text, bigint, float8, bigint)
        IS '{SCHEMA_VERSION}';
    COMMENT ON FUNCTION orbitive_limits_acquire_sliding(text, bigint, float8, bigint)
        IS '{SCHEMA_VERSION}';
END
$orbitive$"""
INCR: Final = """
INSERT INTO orbitive_limits_counters AS c (key, value, expires_at)
VALUES (%(key)s, %(amount)s::bigint, clock_timestamp() + make_interval(secs => %(expiry)s))
ON CONFLICT (key) DO UPDATE
SET (value, expires_at) = (
    SELECT CASE WHEN c.expires_at > x.t THEN c.value + EXCLUDED.value ELSE EXCLUDED.value END,
           CASE WHEN c.expires_at > x.t THEN c.expires_at
                ELSE x.t + make_interval(secs => %(expiry)s) END
    FROM (SELECT clock_timestamp() AS t) AS x)
RETURNING c.value"""
GET: Final = """
SELECT coalesce((SELECT c.value FROM orbitive_limits_counters AS c
                 WHERE c.key = %(key)s AND c.expires_at > clock_timestamp()), 0)"""
GET_EXPIRY: Final = """
SELECT extract(epoch FROM coalesce(
    (SELECT c.expires_at FROM orbitive_limits_counters AS c
     WHERE c.key = %(key)s AND c.expires_at > clock_timestamp()),
    clock_timestamp()))::float8"""
CLEAR: Final = """
WITH counter AS (DELETE FROM orbitive_limits_counters WHERE key = %(key)s),
     moving AS (DELETE FROM orbitive_limits_moving WHERE key = %(key)s)
SELECT 1"""
RESET: Final = """
WITH a AS (DELETE FROM orbitive_limits_counters RETURNING expires_at),
     b AS (DELETE FROM orbitive_limits_moving RETURNING expires_at),
     c AS (DELETE FROM orbitive_limits_sliding RETURNING expires_at)
SELECT count(*) FROM (SELECT * FROM a UNION ALL SELECT * FROM b UNION ALL SELECT * FROM c) AS d
WHERE d.expires_at > clock_timestamp()"""
ACQUIRE_ENTRY: Final = (
    "SELECT orbitive_limits_acquire_entry(%(key)s, %(limit)s::bigint, %(expiry)s::float8, "
    "%(amount)s::bigint)"
)
MOVING_WINDOW: Final = """
SELECT x.t, min(u.a), coalesce(sum(u.c), 0)::bigint
FROM (SELECT extract(epoch FROM clock_timestamp())::float8 AS t) AS x
LEFT JOIN orbitive_limits_moving AS m ON m.key = %(key)s
LEFT JOIN LATERAL unnest(m.at, m.n) AS u(a, c) ON u.a > x.t - %(expiry)s::float8
GROUP BY x.t"""
ACQUIRE_SLIDING: Final = (
    "SELECT orbitive_limits_acquire_sliding(%(key)s, %(limit)s::bigint, %(expiry)s::float8, "
    "%(amount)s::bigint)"
)
SLIDING_WINDOW: Final = """
SELECT x.t, s.win, s.prev, s.cur
FROM (SELECT extract(epoch FROM clock_timestamp())::float8 AS t) AS x
LEFT JOIN orbitive_limits_sliding AS s ON s.key = %(key)s"""
CLEAR_SLIDING: Final = "DELETE FROM orbitive_limits_sliding WHERE key = %(key)s"
CHECK: Final = "SELECT 1"
_SWEEP_ONE: Final = """
{name} AS (DELETE FROM {table} WHERE key IN (
    SELECT key FROM {table} WHERE expires_at <= clock_timestamp()
    ORDER BY expires_at LIMIT {rows} FOR UPDATE SKIP LOCKED) RETURNING 1)"""
SWEEP: Final = (
    "WITH"
    + ",".join(
        _SWEEP_ONE.format(name=name, table=f"orbitive_limits_{name}", rows=SWEEP_ROWS)
        for name in ("counters", "moving", "sliding")
    )
    + "\nSELECT (SELECT count(*) FROM counters) + (SELECT count(*) FROM moving)"
    " + (SELECT count(*) FROM sliding)"
)


def parse_url(uri: object, options: Mapping[str, object], schemes: tuple[str, ...]) -> str:
    """Check a storage URL and its options; return the libpq URL (``async+`` removed).

    Raises:
        InvalidRateStorageUrl: ``uri`` is not a str, has another scheme than ``schemes``,
            is malformed (see :func:`~orbitive.store._url.postgres_conninfo`), or an
            option is given (connection settings go in the URL).
    """
    if type(uri) is not str:
        raise InvalidRateStorageUrl(
            f"rate-limit storage URL must be a str, not {type(uri).__name__}"
        )
    scheme, colon, _ = uri.partition("://")
    if not colon or scheme.lower() not in schemes:
        shown = uri[: uri.index(":")] if ":" in uri else uri[:20]
        raise InvalidRateStorageUrl(
            f"rate-limit storage URL {shown!r}...: expected one of "
            + ", ".join(f"{s}://" for s in schemes)
        )
    if options:
        names = ", ".join(sorted(map(str, options)))
        raise InvalidRateStorageUrl(
            f"{scheme}:// rate-limit storage takes no option ({names}): put connection "
            "settings in the URL, as libpq query parameters (sslmode=require, "
            "options=-csearch_path%3Dmyschema, ...) or ?timeout=S for the call bound"
        )
    libpq_url = uri.split("+", 1)[1] if scheme.lower().startswith("async+") else uri
    try:
        postgres_conninfo(libpq_url)
    except InvalidStoreUrl as error:
        raise InvalidRateStorageUrl(f"{scheme}:// rate-limit storage: {error.message}") from None
    return libpq_url


def open_engine(libpq_url: str) -> PostgresEngine:
    """The store's PostgreSQL engine for ``libpq_url``, without the lock tables; it
    connects on its first call.

    Raises:
        StoreError: ``UNAVAILABLE`` when psycopg is not installed.
    """
    conninfo, timeout = postgres_conninfo(libpq_url)
    return PostgresEngine(conninfo, timeout=timeout, locks=False, what="postgres rate storage")


def checked_key(key: object) -> str:
    """``key`` when it is a str the table takes.

    Raises:
        TypeError: not a str.
        ValueError: a NUL, a lone surrogate, or longer than :data:`KEY_MAX_BYTES`.
    """
    if type(key) is not str:
        raise TypeError(f"rate-limit key must be a str, not {type(key).__name__}")
    try:
        size = len(key.encode())
    except UnicodeEncodeError:
        raise ValueError("rate-limit key has no UTF-8 form (a lone surrogate)") from None
    if size > KEY_MAX_BYTES or "\x00" in key:
        raise ValueError(
            f"rate-limit key must be at most {KEY_MAX_BYTES} UTF-8 bytes without NUL, "
            f"got {size} bytes"
        )
    return key


def checked_expiry(expiry: object) -> float:
    """``expiry`` as float seconds.

    Raises:
        TypeError: not an int or float (or a bool).
        ValueError: not above 0 and at most :data:`EXPIRY_MAX_S` (NaN and inf included).
    """
    if type(expiry) not in (int, float):
        raise TypeError(
            f"rate-limit expiry must be seconds (int or float), not {type(expiry).__name__}"
        )
    seconds = float(expiry)  # type: ignore[arg-type]  # int or float, checked above
    if not 0.0 < seconds <= EXPIRY_MAX_S:  # also refuses NaN
        raise ValueError(
            f"rate-limit expiry must be seconds above 0 and at most {EXPIRY_MAX_S:g}, "
            f"got {expiry!r}"
        )
    return seconds


def checked_count(value: object, what: str, least: int) -> int:
    """``value`` when it is an int of at least ``least`` (and at most 2**62).

    Raises:
        TypeError: not an int (or a bool).
        ValueError: out of range.
    """
    if type(value) is not int:
        raise TypeError(f"rate-limit {what} must be an int, not {type(value).__name__}")
    if not least <= value <= 2**62:
        raise ValueError(f"rate-limit {what} must be in {least}..2**62, got {value}")
    return value


def hit_params(key: object, limit: object, expiry: object, amount: object) -> dict[str, object]:
    """The checked parameters of an acquisition.

    Raises:
        TypeError, ValueError: as :func:`checked_key`, :func:`checked_expiry` and
            :func:`checked_count`.
    """
    return {
        "key": checked_key(key),
        "limit": checked_count(limit, "limit", 0),
        "expiry": checked_expiry(expiry),
        "amount": checked_count(amount, "amount", 1),
    }


def moving_window(row: tuple[Any, ...]) -> tuple[float, int]:
    """``get_moving_window``'s answer from :data:`MOVING_WINDOW`'s row."""
    now, oldest, count = row
    return (float(oldest), int(count)) if count else (float(now), 0)


def sliding_window(row: tuple[Any, ...], expiry: float) -> tuple[int, float, int, float]:
    """``get_sliding_window``'s answer from :data:`SLIDING_WINDOW`'s row: the previous
    window's count and seconds left of its weight, the current one's count and ttl."""
    now, win, prev, cur = row
    current = math.floor(now / expiry)
    if win is None:
        win, prev, cur = current, 0, 0
    window = max(current, win)
    prev = {0: prev, 1: cur}.get(window - win, 0)
    cur = cur if window == win else 0
    prev_ttl = 0.0 if prev == 0 else min(max((window + 1) * expiry - now, 0.0), expiry)
    return int(prev), float(prev_ttl), int(cur), float((window + 2) * expiry - now)


class ClosedWhenDropped:
    """Closes the connections of a storage nobody refers to any more (``limits`` has no
    close step: a storage made per ``asyncio.run`` would otherwise leave them open)."""

    def close(self) -> None:
        """Close the storage's connections (each storage has its own)."""
        raise NotImplementedError

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # a half-made storage has no engine
            self.close()


class PostgresStorage(
    Storage,
    MovingWindowSupport,
    SlidingWindowCounterSupport,
    TimestampedSlidingWindow,
    ClosedWhenDropped,
):
    """Rate-limit counters in PostgreSQL, for the ``limits`` package (``postgresql://``).

    Every strategy of ``limits`` (fixed window, moving window, sliding window counter)
    holds one exact limit for every process of every host that uses the database:
    each acquisition is one round trip that locks the key's row. Tables
    ``orbitive_limits_counters``, ``orbitive_limits_moving`` and
    ``orbitive_limits_sliding`` (and two functions) are created on the first call, in
    the first schema of the connection's ``search_path``. See docs/limits.md.

    Args:
        uri: ``postgresql://user:password@host:port/db`` (or ``postgres://``): any libpq
            URI, with its query parameters (``sslmode``, ``options=-csearch_path%3DS``,
            ...), and ``?timeout=S``, the bound in seconds on every call (default 5).
        wrap_exceptions: raise ``limits.errors.StorageError`` (its cause the
            :class:`~orbitive.StoreError`) instead of the ``StoreError`` itself.
        options: none is taken; connection settings go in the URL.

    Raises:
        InvalidRateStorageUrl: ``uri`` is malformed or not a ``postgresql://`` URL, or an
            option is given (also ``ValueError``).
        StoreError: ``UNAVAILABLE`` when psycopg is not installed.

    Every method but :meth:`check` raises ``StoreError`` (kind ``UNAVAILABLE`` when the
    server cannot be reached within the timeout, ``DATABASE`` for any other database
    error), or ``limits.errors.StorageError`` around it with ``wrap_exceptions``.
    """

    STORAGE_SCHEME = list(SCHEMES)  # noqa: RUF012 - limits reads a list

    def __init__(
        self, uri: str, wrap_exceptions: bool = False, **options: float | str | bool
    ) -> None:
        self._url = parse_url(uri, options, SCHEMES)
        super().__init__(uri, wrap_exceptions=wrap_exceptions)
        self._engine = open_engine(self._url)
        self._ready = False
        self._swept_at = time.monotonic()
        self._sweep_mutex = threading.Lock()

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        """What the methods raise: ``StoreError``."""
        return StoreError

    # -- the fixed window -------------------------------------------------------------------

    def incr(self, key: str, expiry: float, amount: int = 1) -> int:
        """Add ``amount`` to the counter of ``key``, starting a new window of ``expiry``
        seconds when it has none live.

        Args:
            key: the rate-limit key (a str of at most 2048 UTF-8 bytes, no NUL).
            expiry: the window's length in seconds (a float or int above 0, at most 1e9).
            amount: what to add (an int >= 1).

        Returns:
            The counter after the increment (int).

        Raises:
            TypeError, ValueError: a bad argument (before any round trip).
            StoreError: see the class.
        """
        params = {
            "key": checked_key(key),
            "expiry": checked_expiry(expiry),
            "amount": checked_count(amount, "amount", 1),
        }
        return int(self._write(INCR, params)[0])

    def get(self, key: str) -> int:
        """The counter of ``key`` (int), 0 when it has no live window.

        Raises:
            TypeError, ValueError: a bad key. StoreError: see the class.
        """
        return int(self._row(GET, {"key": checked_key(key)})[0])

    def get_expiry(self, key: str) -> float:
        """When the window of ``key`` ends, in Unix epoch seconds (float) of the server's
        clock; the server's time now when it has no live window.

        Raises:
            TypeError, ValueError: a bad key. StoreError: see the class.
        """
        return float(self._row(GET_EXPIRY, {"key": checked_key(key)})[0])

    def clear(self, key: str) -> None:
        """Forget the fixed-window counter and the moving window of ``key``.

        Raises:
            TypeError, ValueError: a bad key. StoreError: see the class.
        """
        self._row(CLEAR, {"key": checked_key(key)})

    def reset(self) -> int | None:
        """Forget every key of every strategy (for every process using the database).

        Returns:
            How many live keys were removed (int).

        Raises:
            StoreError: see the class.
        """
        return int(self._row(RESET, {})[0])

    def check(self) -> bool:
        """Whether the server answers (and the tables exist) within the timeout: never raises."""
        try:
            self._row(CHECK, {})
        except StoreError:
            return False
        return True

    # -- the moving window ------------------------------------------------------------------

    def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        """Record ``amount`` hits of ``key`` now if the last ``expiry`` seconds hold at
        most ``limit - amount`` hits.

        Args:
            key: the rate-limit key (a str of at most 2048 UTF-8 bytes, no NUL).
            limit: hits allowed in any ``expiry`` seconds (an int >= 0).
            expiry: the window's length in seconds (a float or int above 0, at most 1e9).
            amount: the hits to record (an int >= 1).

        Returns:
            True when they were recorded, False when they would exceed the limit.

        Raises:
            TypeError, ValueError: a bad argument (before any round trip).
            StoreError: see the class.
        """
        return self._hit(ACQUIRE_ENTRY, key, limit, expiry, amount)

    def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        """The moving window of ``key`` now.

        Args:
            key: the rate-limit key (a str of at most 2048 UTF-8 bytes, no NUL).
            limit: the limit (an int; unused: the window holds no more hits).
            expiry: the window's length in seconds (a float or int above 0, at most 1e9).

        Returns:
            (the epoch second of its oldest hit, or now when it has none; the hits in it).

        Raises:
            TypeError, ValueError: a bad argument. StoreError: see the class.
        """
        params = {"key": checked_key(key), "expiry": checked_expiry(expiry)}
        return moving_window(self._row(MOVING_WINDOW, params))

    # -- the sliding window counter ---------------------------------------------------------

    def acquire_sliding_window_entry(
        self, key: str, limit: int, expiry: int, amount: int = 1
    ) -> bool:
        """Count ``amount`` hits of ``key`` in the current window if the previous window's
        count, weighted by the share of it still inside the sliding window, plus the
        current count and ``amount`` stays within ``limit``.

        Args:
            key: the rate-limit key (a str of at most 2048 UTF-8 bytes, no NUL).
            limit: hits allowed per window (an int >= 0).
            expiry: the window's length in seconds (a float or int above 0, at most 1e9).
            amount: the hits to count (an int >= 1).

        Returns:
            True when they were counted, False when they would exceed the limit.

        Raises:
            TypeError, ValueError: a bad argument (before any round trip).
            StoreError: see the class.
        """
        return self._hit(ACQUIRE_SLIDING, key, limit, expiry, amount)

    def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        """The sliding window of ``key`` now.

        Args:
            key: the rate-limit key.
            expiry: the window's length in seconds (a float or int above 0, at most 1e9).

        Returns:
            (the previous window's count, seconds until it stops weighing, the current
            window's count, seconds until the current window's count is gone).

        Raises:
            TypeError, ValueError: a bad argument. StoreError: see the class.
        """
        seconds = checked_expiry(expiry)
        return sliding_window(self._row(SLIDING_WINDOW, {"key": checked_key(key)}), seconds)

    def clear_sliding_window(self, key: str, expiry: int) -> None:
        """Forget the sliding window of ``key`` (``expiry`` is checked, not needed).

        Raises:
            TypeError, ValueError: a bad argument. StoreError: see the class.
        """
        checked_expiry(expiry)
        self._row(CLEAR_SLIDING, {"key": checked_key(key)})

    # -- the connection ---------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (a later call fails with ``StoreError(CLOSED)``)."""
        self._engine.close()

    def _row(self, sql: str, params: dict[str, object]) -> tuple[Any, ...]:
        """The first row of one statement (an empty tuple when it returns none)."""
        if not self._ready:
            self._engine.run_step(_create_schema)
            self._ready = True
        return self._engine.run_step(lambda conn: _first_row(conn, sql, params))

    def _write(self, sql: str, params: dict[str, object]) -> tuple[Any, ...]:
        """:meth:`_row` for a write, followed by a sweep of expired rows once a minute."""
        row = self._row(sql, params)
        if time.monotonic() - self._swept_at >= SWEEP_EVERY_S and self._sweep_mutex.acquire(
            blocking=False
        ):
            try:
                self._swept_at = time.monotonic()
                self._row(SWEEP, {})
            finally:
                self._sweep_mutex.release()
        return row

    def _hit(self, sql: str, key: str, limit: int, expiry: float, amount: int) -> bool:
        """One acquisition (``sql``, on :func:`hit_params`): False without a round trip when
        ``amount`` is above ``limit``."""
        params = hit_params(key, limit, expiry, amount)
        if amount > limit:
            return False
        return bool(self._write(sql, params)[0])

    def __repr__(self) -> str:
        return f"<PostgresStorage {_redacted(self._url)}>"


def _create_schema(conn: psycopg.Connection[Any]) -> None:
    conn.execute(SCHEMA)


def _first_row(
    conn: psycopg.Connection[Any], sql: str, params: dict[str, object]
) -> tuple[Any, ...]:
    cursor = conn.execute(sql, params or None)
    if cursor.description is None:
        return ()
    row: tuple[Any, ...] | None = cursor.fetchone()
    return () if row is None else row
