"""One process, several pools of one key: a waiter of one is never stranded while the
budget sits idle in another (a live pool, or one dropped without ``close()``).

Pools that create their clients with one callable check out each other's idle
clients; pools that create them otherwise (a sync and an asyncio pool of one key)
never receive each other's clients: the waiter's pool closes the other's idle
client and creates its own.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator

import pytest

from orbitive import Fleet
from orbitive.clients import ClientPool, PoolOptions, UnknownClient

from ._fakes import FakeClient, close

#: A waiter that is served gets its client well within this; a stranded one never does.
SERVED_S = 2.0


@pytest.fixture(autouse=True)
def _counts() -> Iterator[None]:
    FakeClient.reset_counts()
    yield


def _pool(fleet: Fleet, create: object = FakeClient) -> ClientPool[FakeClient]:
    return ClientPool(
        fleet, "shared", create=create, close=close,  # type: ignore[arg-type]  # FakeClient
        options=PoolOptions(max_live=1, acquire_timeout=SERVED_S),
    )  # fmt: skip


def _another_create() -> FakeClient:
    return FakeClient()


def _live(fleet: Fleet) -> int:
    """The key's live clients fleet-wide, as a fresh pool of the key counts them."""
    with _pool(fleet, _another_create) as probe:
        return probe.statistics().live


def test_a_waiter_of_one_pool_takes_the_idle_client_of_another_pool_of_the_key(
    fleet: Fleet,
) -> None:
    with _pool(fleet) as first, _pool(fleet) as second:
        client = first.getconn()
        first.putconn(client)  # idle in the first pool; the key is at max_live
        started = time.monotonic()
        assert second.getconn() is client  # the same client, not a timeout
        assert time.monotonic() - started < SERVED_S
        assert FakeClient.highest == 1
        first.putconn(client)  # one pool of the key takes back what another checked out
        assert second.statistics().local_idle == 1


def test_pools_of_one_key_that_create_otherwise_never_strand_each_others_waiters(
    fleet: Fleet,
) -> None:
    with _pool(fleet) as first, _pool(fleet, _another_create) as second:
        client = first.getconn()
        first.putconn(client)
        started = time.monotonic()
        own = second.getconn()  # the first pool's idle client is closed for it
        assert time.monotonic() - started < SERVED_S
        assert own is not client and client.closed
        with pytest.raises(UnknownClient):
            first.putconn(own)  # not a client the first pool hands out
        second.putconn(own)
        assert second.statistics().live == 1


def test_an_asyncio_pool_of_a_key_never_gets_a_client_a_sync_pool_of_it_made(
    fleet: Fleet,
) -> None:
    """As a sync and an asyncio psycopg pool of one database: one budget, two kinds."""

    class AsyncMade(FakeClient):
        pass

    async def make() -> AsyncMade:
        await asyncio.sleep(0)
        return AsyncMade()

    async def scenario(
        sync_pool: ClientPool[FakeClient], async_pool: ClientPool[FakeClient]
    ) -> None:
        sync_client = sync_pool.getconn()
        sync_pool.putconn(sync_client)
        async with async_pool.client_async(timeout=SERVED_S) as client:
            assert isinstance(client, AsyncMade) and sync_client.closed
        await async_pool.close_async()

    with _pool(fleet) as sync_pool:
        asyncio.run(scenario(sync_pool, _pool(fleet, make)))
        assert type(sync_pool.getconn(timeout=SERVED_S)) is FakeClient


def test_a_pool_dropped_unclosed_leaves_its_idle_client_to_the_next_pool_of_the_key(
    fleet: Fleet,
) -> None:
    dropped = _pool(fleet)
    client = dropped.getconn()
    dropped.putconn(client)
    with _pool(fleet) as kept:  # attached before the first one goes
        del dropped
        gc.collect()
        assert kept.getconn(timeout=SERVED_S) is client
        kept.putconn(client)
    assert client.closed and _live(fleet) == 0


def test_the_last_pool_of_a_key_dropped_unclosed_closes_its_idle_clients(fleet: Fleet) -> None:
    dropped = _pool(fleet)
    client = dropped.getconn()
    dropped.putconn(client)
    del dropped
    gc.collect()
    deadline = time.monotonic() + SERVED_S
    while not client.closed:  # closed in a closing thread of its own
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert _live(fleet) == 0
    with _pool(fleet, _another_create) as other:
        other.putconn(other.getconn(timeout=SERVED_S))  # the unit is free
