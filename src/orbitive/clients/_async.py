"""The asyncio half of ClientPool's checkout: the steps that await the user's callables.

``create``, ``check``, ``reset`` and ``close`` run on the loop when they are
coroutine functions, else in a worker thread (:func:`~._calls.call_async`);
the table steps are the same as the sync path's.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from ..pool import CreationPermit
from ._callbacks import call_async
from ._entry import Entry

if TYPE_CHECKING:
    from ._client_pool import ClientPool


async def made(pool: ClientPool[Any], permit: CreationPermit) -> Any:
    """Run ``create`` for ``permit``; a cancelled caller's client joins the idle ones."""
    creating = asyncio.ensure_future(call_async(pool._create))
    try:
        return await asyncio.shield(creating)
    except asyncio.CancelledError:
        if not creating.done():  # the caller gave up: the client joins the idle ones
            creating.add_done_callback(lambda done: adopt(pool, permit, done))
            raise
        raise pool._create_failed(permit, asyncio.CancelledError()) from None
    except BaseException as error:
        raise pool._create_failed(permit, error) from error


def adopt(pool: ClientPool[Any], permit: CreationPermit, done: asyncio.Future[Any]) -> None:
    """A create whose caller was cancelled finished: keep its client idle, or close it."""
    if done.cancelled() or done.exception() is not None or pool._closed:
        permit.finish()
        if not done.cancelled() and done.exception() is None:
            spawn(pool, close_client(pool, done.result()))
        return
    entry = pool._registered(permit, done.result())
    with pool._lock:
        pool._out.pop(id(entry.client), None)
    if not pool._give_back(entry):
        hand_over(pool, entry)


def spawn(pool: ClientPool[Any], work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
    """Run ``work`` as a task of the running loop, kept referenced until done."""
    task = asyncio.get_running_loop().create_task(work)
    pool._tasks.add(task)
    task.add_done_callback(pool._tasks.discard)
    return task


def hand_over(pool: ClientPool[Any], entry: Entry[Any]) -> None:
    """Retire ``entry`` off the returning caller's path.

    A sync ``close`` runs in one of the pool's closing threads, as a sync return's does.
    A coroutine ``close`` runs in a task of this loop; the loop may end first
    (``asyncio.run`` cancels the tasks left once its coroutine returns, before
    or during the close), and then a closing thread closes the client on a
    loop of its own. Either way the budget returns once the client is closed.
    """
    if not inspect.iscoroutinefunction(pool._close):
        pool._hand_over(entry)
        return
    _closing(pool, entry)


def _closing(pool: ClientPool[Any], entry: Entry[Any]) -> asyncio.Task[None]:
    """A task of this loop that closes ``entry``'s coroutine-``close`` client, then
    unregisters it (a loop that ends first leaves both to a closing thread)."""
    task = spawn(pool, _closed_then_unregistered(pool, entry))
    task.add_done_callback(lambda done: _after(pool, entry, done))
    return task


async def _closed_then_unregistered(pool: ClientPool[Any], entry: Entry[Any]) -> None:
    await close_client(pool, entry.client)
    pool._unregister(entry)


def _after(pool: ClientPool[Any], entry: Entry[Any], done: asyncio.Task[None]) -> None:
    if done.cancelled():  # the loop ended first: a closing thread closes the client
        pool._hand_over(entry)


async def usable(pool: ClientPool[Any], entry: Entry[Any]) -> bool:
    """Whether an idle client taken for checkout may be used (else it was discarded)."""
    if pool._expired(entry, time.monotonic()):
        await pool.discard_async(entry.client)
        return False
    if pool._check is None:
        return True
    try:
        healthy = await call_async(pool._check, entry.client) is not False
    except Exception:
        healthy = False
    if not healthy:
        pool.counters.check_failures += 1
        await pool.discard_async(entry.client)
    return healthy


async def retire(pool: ClientPool[Any], entry: Entry[Any]) -> None:
    """Close the client, then its resource in the table (the budget returns last).

    A caller cancelled meanwhile (``asyncio.wait_for``, say) leaves the close running,
    and the budget returns once it is done: a sync ``close`` runs in a worker thread
    that then unregisters the client, a coroutine ``close`` in a task of this loop
    (:func:`hand_over`'s).
    """
    if inspect.iscoroutinefunction(pool._close):
        await asyncio.shield(_closing(pool, entry))
    else:
        await asyncio.to_thread(pool._retire, entry)


async def close_client(pool: ClientPool[Any], client: Any) -> None:
    """``close(client)`` without blocking the loop; its errors are counted."""
    try:
        await call_async(pool._close, client)
    except Exception:
        pool.counters.close_errors += 1
    pool.counters.closed += 1
