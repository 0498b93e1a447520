"""Long haul: the Redis store serves again after hundreds of failed calls and restarts.

A long-lived worker, or an ``orbit run`` that renews for hours, sees network
blips and server restarts. Each failed call must leave the store as it was:
the next call after the network heals (or the server is back) is served within
the URL's call bound, however many calls failed before.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from orbitive.store import ErrorKind, Store, StoreError, open_store

from .._servers import ServerUnavailable, TempRedis
from ._faultproxy import FaultProxy

#: The proxied store's ``?timeout=``, in seconds.
BOUND_S = 1.0
#: Rounds of (calls into a cut network, heal, a restart of the server).
ROUNDS = 6
#: Failed calls per round while the network is cut.
CUT_CALLS = 60
#: Failed calls per round while the server is down.
DOWN_CALLS = 5
#: What a call may take beyond its bound on this noisy VM.
SLACK_S = 1.0


@pytest.fixture
def own_server(redis_server: TempRedis) -> Iterator[TempRedis]:
    """A server of this test's own, to restart (``redis_server``: skip without a binary)."""
    del redis_server
    try:
        server = TempRedis.start()
    except ServerUnavailable as error:
        pytest.fail(f"Redis unavailable: {error}")
    try:
        yield server
    finally:
        server.stop()


def _fails(store: Store) -> None:
    with pytest.raises(StoreError) as caught:
        store.try_lock("long-haul", "w1", 30.0)
    assert caught.value.kind is ErrorKind.UNAVAILABLE, caught.value


def _served_within_the_bound(store: Store) -> None:
    started = time.monotonic()
    lock = store.try_lock("long-haul", "w1", 30.0)
    assert lock is not None
    assert lock.release()
    assert time.monotonic() - started < BOUND_S + SLACK_S


def test_the_store_serves_again_after_hundreds_of_failed_calls_and_restarts(
    own_server: TempRedis,
) -> None:
    failed = 0
    with (
        FaultProxy(own_server.port) as proxy,
        open_store(f"redis://127.0.0.1:{proxy.port}/0?timeout={BOUND_S:g}") as store,
    ):
        _served_within_the_bound(store)
        for _ in range(ROUNDS):
            proxy.cut()
            for _ in range(CUT_CALLS):
                _fails(store)
                failed += 1
            proxy.heal()
            _served_within_the_bound(store)
            own_server.halt()
            for _ in range(DOWN_CALLS):
                _fails(store)
                failed += 1
            own_server.restart()
            _served_within_the_bound(store)  # a fresh server: the scripts are loaded again
    assert failed == ROUNDS * (CUT_CALLS + DOWN_CALLS) == 390
