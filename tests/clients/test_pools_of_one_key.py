"""Pools of one key in one process (issue 19, item 3): a waiter in the process must be
served while the key's budget sits idle in that same process, whether in another pool
of the key or in a pool dropped without ``close()``.

A waiter in another process is served within the upkeep's grace (a fraction of a
second); one in the same process must be served as well, within about a second.
"""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

from orbitive import Fleet
from orbitive.clients import ClientPool, PoolOptions

from ._injection import Callbacks, Ledger, Tracked
from ._sweeps import key_live
from .conftest import Prober

#: The waiter's bound, in seconds.
SERVED_WITHIN_S = 1.0

KEY = "one-key"


def _pool(fleet: Fleet, ledger: Ledger) -> ClientPool[Tracked]:
    return Callbacks(ledger, "sync").pool(fleet, KEY, PoolOptions(max_live=1))


def _served(pool: ClientPool[Tracked], asynchronously: bool) -> Tracked:
    """One client of ``pool`` within SERVED_WITHIN_S (PoolTimeout else), given back."""
    if asynchronously:

        async def checkout() -> Tracked:
            client = await pool.getconn_async(timeout=SERVED_WITHIN_S)
            await pool.putconn_async(client)
            return client

        return asyncio.run(checkout())
    client = pool.getconn(timeout=SERVED_WITHIN_S)
    pool.putconn(client)
    return client


def _each_closed_once(fleet: Fleet, ledger: Ledger) -> None:
    """Every client the pools created is closed exactly once, and none is live, within
    a generous bound (a dropped pool's may close as it is collected)."""
    deadline = time.monotonic() + 5.0
    while (ledger.unclosed() or key_live(fleet, KEY)) and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert ledger.unclosed() == []
    assert ledger.problems == []
    assert key_live(fleet, KEY) == 0


@pytest.mark.parametrize("asynchronously", [False, True], ids=["getconn", "getconn_async"])
def test_a_waiter_is_served_while_another_pool_of_its_key_in_its_process_holds_it_idle(
    fleet: Fleet, asynchronously: bool
) -> None:
    ledger = Ledger()
    holder, waiter = _pool(fleet, ledger), _pool(fleet, ledger)
    try:
        holder.putconn(holder.getconn())  # the key's whole budget, idle in `holder`
        assert holder.statistics().local_idle == 1
        _served(waiter, asynchronously)
    finally:
        holder.close()
        waiter.close()
    _each_closed_once(fleet, ledger)


@pytest.mark.parametrize("asynchronously", [False, True], ids=["getconn", "getconn_async"])
def test_a_waiter_is_served_while_a_pool_dropped_without_close_holds_its_key_idle(
    fleet: Fleet, prober: Prober, asynchronously: bool
) -> None:
    ledger = Ledger()
    dropped = _pool(fleet, ledger)
    dropped.putconn(dropped.getconn())  # the key's whole budget, idle in `dropped`
    del dropped
    gc.collect()
    waiter = _pool(fleet, ledger)
    try:
        _served(waiter, asynchronously)
    finally:
        waiter.close()
    _each_closed_once(fleet, ledger)
    assert prober.probe(KEY, 1, SERVED_WITHIN_S) is None  # and another process's too
