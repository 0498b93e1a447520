"""The checkout past the idle fast path: take, create or wait at ``max_live``, until a deadline.

A caller that finds no idle client of its process claims creation under
``max_live`` fleet-wide, or counts itself as a waiter in the pool table (so
owners holding idle clients elsewhere retire one for it) and sleeps on the key's
version word, in slices of at most :data:`WAIT_SLICE_S`, until the deadline.

A checkout right after this process closed its client for another process's
waiter is *polite* (:func:`polite`): it lets that waiter create first.

:func:`plan` holds the decisions and does none of the user's I/O; the sync and
asyncio drivers run its actions (check a client, create one, wait) their way.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from .._core._errors import (
    BusyError,
    DrainingError,
    FleetError,
    NotOwnerError,
    PoolTimeout,
    StaleError,
    TooManyRequests,
)
from ..pool import CreationPermit
from ..pool._availability import add_waiter, key_census
from ._async import made, usable
from ._entry import Entry
from ._options import HANDOFF_GRACE_S, seconds

if TYPE_CHECKING:
    from ._client_pool import ClientPool

#: Longest single sleep of a waiter: it re-checks at least this often.
WAIT_SLICE_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class Use:
    """Check an idle client taken for checkout (answer: whether it is usable)."""

    entry: Entry[Any]


@dataclass(frozen=True, slots=True)
class Create:
    """Run ``create`` under this claim (answer: the new client)."""

    permit: CreationPermit


@dataclass(frozen=True, slots=True)
class Wait:
    """Sleep until the key's version differs from ``version``, at most ``seconds``
    (answer: the new version, or None)."""

    version: int
    seconds: float


Action = Use | Create | Wait


def plan(pool: ClientPool[Any], timeout: float | None) -> Generator[Action, Any, Any]:
    """The checkout's decisions, without the I/O: yields what to do, returns the client.

    The sync and asyncio drivers (:func:`checkout`, :func:`checkout_async`) do
    each action their way and send the answer back. A waiter is counted out
    as soon as it is served (before its client is checked or created), or when
    the generator closes.
    """
    end, is_polite = deadline(pool, timeout), polite(pool)
    version: int | None = None
    began = 0.0  # when this caller began to wait at max_live
    try:
        while True:
            pool._local()
            step = pool._step(is_polite)
            if step is not None and version is not None:  # served: no longer a waiter
                version = None
                stop_waiting(pool, began, timed_out=False)
            if isinstance(step, Entry):
                if (yield Use(step)):
                    return step.client
            elif step is not None:
                return pool._registered(step, (yield Create(step))).client
            elif version is None:
                version, began = start_waiting(pool), time.monotonic()
            else:
                try:
                    seconds_left = wait_slice(pool, end, is_polite)
                except PoolTimeout:
                    version = None
                    stop_waiting(pool, began, timed_out=True)
                    raise
                changed = yield Wait(version, seconds_left)
                version = pool.pool.version(pool.key) if changed is None else changed
                is_polite = False
    finally:
        if version is not None:
            stop_waiting(pool, began, timed_out=None)


def checkout(pool: ClientPool[Any], timeout: float | None) -> Any:
    """:meth:`ClientPool.getconn` past its fast path (raises as it documents)."""
    steps = plan(pool, timeout)
    try:
        action = next(steps)
        while True:
            if isinstance(action, Use):
                action = steps.send(pool._usable(action.entry))
            elif isinstance(action, Create):
                action = steps.send(pool._made(action.permit))
            else:
                changed = pool.pool.wait_capacity(pool.key, action.version, action.seconds)
                action = steps.send(changed)
    except StopIteration as done:
        return done.value
    except FleetError:
        pool._local()  # closed meanwhile: PoolClosed
        raise
    finally:
        steps.close()


async def checkout_async(pool: ClientPool[Any], timeout: float | None) -> Any:
    """Asyncio twin of :func:`checkout`: waits on the pool's readiness descriptor."""
    steps = plan(pool, timeout)
    try:
        action = next(steps)
        while True:
            if isinstance(action, Use):
                action = steps.send(await usable(pool, action.entry))
            elif isinstance(action, Create):
                action = steps.send(await made(pool, action.permit))
            else:
                changed = await pool.pool.poll_capacity(pool.key, action.version, action.seconds)
                action = steps.send(changed)
    except StopIteration as done:
        return done.value
    except FleetError:
        pool._local()  # closed meanwhile: PoolClosed
        raise
    finally:
        steps.close()


def take_idle_sorting(pool: ClientPool[Any]) -> Entry[Any] | None:
    """``ClientPool._take_idle`` past idle clients a borrower reserved or the table closed.

    A reserved one stays idle (the borrower's request runs on it); a closed or
    drained one is retired (closed, and its slot unregistered).
    """
    doomed, busy = [], []
    try:
        with pool._lock:
            while pool._idle:
                entry = pool._idle.pop()
                try:
                    pool._take_unit(entry.rid)
                except BusyError:  # a borrower reserved it (remote mode): theirs now
                    busy.append(entry)
                    continue
                except (StaleError, NotOwnerError, DrainingError):
                    doomed.append(entry)  # reset, or drained: close it (and its slot)
                    continue
                pool._out[id(entry.client)] = entry
                entry.uses += 1
                return entry
        return None
    finally:
        with pool._lock:
            pool._idle[:0] = busy
        for entry in doomed:
            pool._retire(entry)


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
            f"no client for {pool.name} within the timeout "
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
                f"{pool._waiters} callers of this process already wait for "
                f"{pool.name} (max_waiting {pool.options.max_waiting})",
                key=pool.key,
            )
        pool._waiters += 1
        pool.counters.queued += 1
    try:
        return add_waiter(pool.table, pool.key, 1)
    except BaseException:
        with pool._lock:
            pool._waiters -= 1
        raise


def stop_waiting(pool: ClientPool[Any], began: float, *, timed_out: bool | None) -> None:
    """Count this waiter out again, and its wait since ``began`` (``time.monotonic()``):
    in this process's ``waited_s``, and in the key's wait counters when it ended in a
    client (``timed_out`` False) or a timeout (True), not otherwise (None)."""
    waited = time.monotonic() - began
    with pool._lock:
        pool._waiters -= 1
        pool.counters.waited_s += waited
    outcome = None if timed_out is None else (int(waited * 1e6), timed_out)
    pool._settle(lambda handle: add_waiter(handle._t(), pool.key, -1, outcome))
