"""The checkout past the idle fast path: take, create or wait at ``max_live``, until a deadline.

A caller that finds no idle client of its process claims creation under
``max_live`` fleet-wide, or counts itself as a waiter in the pool table (so
owners holding idle clients elsewhere retire one for it) and sleeps on the key's
version word, in slices of at most :data:`WAIT_SLICE_S`, until the deadline.

A checkout right after this process closed its client for another process's
waiter is *polite* (:func:`polite`): it lets that waiter create first.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final

from .._errors import FleetError, PoolTimeout, TooManyRequests
from ..pool._availability import add_waiter, key_census
from ._async import made, usable
from ._entry import Entry
from ._options import HANDOFF_GRACE_S, seconds

if TYPE_CHECKING:
    from ._pool import ClientPool

#: Longest single sleep of a waiter: it re-checks at least this often.
WAIT_SLICE_S: Final = 1.0


def checkout(pool: ClientPool[Any], timeout: float | None) -> Any:
    """:meth:`ClientPool.getconn` past its fast path (raises as it documents)."""
    end, is_polite = deadline(pool, timeout), polite(pool)
    version: int | None = None
    try:
        while True:
            pool._local()
            step = pool._step(is_polite)
            if isinstance(step, Entry):
                if pool._usable(step):
                    return step.client
            elif step is not None:
                return pool._registered(step, pool._made(step)).client
            elif version is None:
                version = start_waiting(pool)
            else:
                wait = wait_slice(pool, end, is_polite)
                changed = pool.pool.wait_capacity(pool.key, version, wait)
                version = pool.pool.version(pool.key) if changed is None else changed
                is_polite = False
    except FleetError:
        pool._local()  # closed meanwhile: PoolClosed
        raise
    finally:
        if version is not None:
            stop_waiting(pool)


async def checkout_async(pool: ClientPool[Any], timeout: float | None) -> Any:
    """Asyncio twin of :func:`checkout`: waits on the pool's readiness descriptor."""
    end, is_polite = deadline(pool, timeout), polite(pool)
    version: int | None = None
    try:
        while True:
            pool._local()
            step = pool._step(is_polite)
            if isinstance(step, Entry):
                if await usable(pool, step):
                    return step.client
            elif step is not None:
                return pool._registered(step, await made(pool, step)).client
            elif version is None:
                version = start_waiting(pool)
            else:
                wait = wait_slice(pool, end, is_polite)
                changed = await pool.pool.poll_capacity(pool.key, version, wait)
                version = pool.pool.version(pool.key) if changed is None else changed
                is_polite = False
    except FleetError:
        pool._local()  # closed meanwhile: PoolClosed
        raise
    finally:
        if version is not None:
            stop_waiting(pool)


def polite(pool: ClientPool[Any]) -> bool:
    """Whether this checkout lets another process's waiter create first.

    True when this process's last return closed its client while another
    process waited, and one still waits: the capacity was freed for that
    waiter, and a checkout of ours that claimed it at once (it is already
    running, the waiter still waking) would strand the waiter again and waste
    a connection. A polite checkout waits one change of the key (at most
    :data:`HANDOFF_GRACE_S`) before it claims.
    """
    if not pool._handed_over:
        return False
    pool._handed_over = False
    table = pool.table
    return key_census(table, pool.key).others_waiting(table.node) > 0


def deadline(pool: ClientPool[Any], timeout: float | None) -> float:
    """``time.monotonic()`` seconds a checkout gives up at (None: ``acquire_timeout``).

    Raises:
        InvalidPoolOptions: a bad timeout.
    """
    wait = pool.options.acquire_timeout if timeout is None else seconds("timeout", timeout)
    return time.monotonic() + wait


def time_left(pool: ClientPool[Any], end: float) -> float:
    """Seconds the next wait may last, at most :data:`WAIT_SLICE_S`.

    Raises:
        PoolTimeout: ``end`` has passed.
    """
    remaining = end - time.monotonic()
    if remaining <= 0:
        pool.counters.timeouts += 1
        raise PoolTimeout(
            f"no client for key {pool.key} within the timeout "
            f"(max_live {pool.options.max_live} reached fleet-wide)",
            key=pool.key,
        )
    return min(remaining, WAIT_SLICE_S)


def wait_slice(pool: ClientPool[Any], end: float, is_polite: bool) -> float:
    """:func:`time_left`, at most :data:`HANDOFF_GRACE_S` for a polite checkout."""
    remaining = time_left(pool, end)
    return min(remaining, HANDOFF_GRACE_S) if is_polite else remaining


def start_waiting(pool: ClientPool[Any]) -> int:
    """Count one waiter of this process in (the table's and ``max_waiting``); the key's version.

    Raises:
        TooManyRequests: ``max_waiting`` callers of this process already wait.
    """
    with pool._lock:
        if pool._waiters >= pool.options.max_waiting:
            pool.counters.refused += 1
            raise TooManyRequests(
                f"{pool._waiters} callers of this process already wait for key "
                f"{pool.key} (max_waiting {pool.options.max_waiting})",
                key=pool.key,
            )
        pool._waiters += 1
    try:
        return add_waiter(pool.table, pool.key, 1)
    except BaseException:
        with pool._lock:
            pool._waiters -= 1
        raise


def stop_waiting(pool: ClientPool[Any]) -> None:
    """Count this waiter out again."""
    with pool._lock:
        pool._waiters -= 1
    pool._settle(lambda handle: add_waiter(handle._t(), pool.key, -1))
