"""A forked child and its parent's client pool: whatever the child calls, the parent's
clients, their table entries and the parent's remote-mode socket stay the parent's.

The child is a real ``os.fork()`` of the test process after the pool was used; it
reports one byte through a pipe and leaves with ``os._exit`` (no finalisers).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator

import pytest

from orbitive import Fleet
from orbitive.clients import ClientPool, PoolOptions

from ._fakes import FakeClient, close


@pytest.fixture(autouse=True)
def _counts() -> Iterator[None]:
    FakeClient.reset_counts()
    yield


def echo_handler(client: FakeClient, payload: bytes) -> bytes:
    del client
    return payload


def _pool(fleet: Fleet, **extra: object) -> ClientPool[FakeClient]:
    return ClientPool(
        fleet, "fake", create=FakeClient, close=close,
        options=PoolOptions(max_live=4), **extra,  # type: ignore[arg-type]
    )  # fmt: skip


def in_child(body: Callable[[], int]) -> int:
    """Run ``body`` in a forked child; its exit byte (255: it raised)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 255
        try:
            code = body()
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    return answer[0]


def test_a_forked_child_discarding_a_parents_client_leaves_it_open(fleet: Fleet) -> None:
    with _pool(fleet) as pool:
        held = pool.getconn()

        def discard() -> int:
            pool.discard(held)  # the parent's: left alone, as putconn does
            return 1 if held.closed else 0

        assert in_child(discard) == 0
        assert not held.closed and pool.statistics().live == 1
        pool.putconn(held)
        assert pool.getconn() is held  # still the parent's, still registered
        pool.putconn(held)


def _listening(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def test_a_forked_child_closing_the_pool_keeps_the_parents_remote_socket(fleet: Fleet) -> None:
    with _pool(fleet, handler=echo_handler) as pool:
        assert pool.request(b"warm") == b"warm"
        server = pool._remote_mode().server
        assert server is not None and _listening(server.path)

        def close_it() -> int:
            pool.close()
            return 0

        assert in_child(close_it) == 0
        assert _listening(server.path)  # borrowers still reach the parent's idle client
        assert pool.request(b"again") == b"again"


def test_a_forked_childs_checkouts_run_on_its_own_table_steps_and_lane(fleet: Fleet) -> None:
    with _pool(fleet) as pool:
        pool.putconn(pool.getconn())  # the parent's C steps bound, one idle client
        (parents,) = pool._family.idle
        table = pool.table
        slot = slice(table.locate(parents.rid), table.locate(parents.rid) + 64)
        before = bytes(table.buf[slot])
        parent_steps = pool._ledger._take_unit

        def use() -> int:
            for _ in range(3):
                client = pool.getconn()
                (entry,) = pool._family.out.values()
                if client is parents.client or entry.rid.node != fleet.node:
                    return 1
                pool.putconn(client)
            return 2 if pool._ledger._take_unit == parent_steps else 0

        assert in_child(use) == 0
        assert bytes(table.buf[slot]) == before  # the parent's unit was never taken
        assert pool.getconn() is parents.client
        pool.putconn(parents.client)


def test_a_forked_child_never_uses_or_closes_the_parents_clients(fleet: Fleet) -> None:
    with _pool(fleet) as pool:
        with pool.client() as parents:
            pass

        def use_then_close() -> int:
            with pool.client() as childs:
                code = 0 if childs is not parents and not parents.closed else 2
            pool.close()
            return code if not parents.closed else 3

        assert in_child(use_then_close) == 0
        with pool.client() as again:
            assert again is parents
