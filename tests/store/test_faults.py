"""Network faults between a store and its server (PostgreSQL, Redis): answers stay true,
for named locks and for counting leases alike.

Each test talks to the server through a :class:`FaultProxy` and checks the
server's state through a second store that connects directly. A lost reply
after commit or a reset mid-statement must not change a call's answer (the
retry recognises its own attempt), and a black hole must end every call with
``StoreError(UNAVAILABLE)`` within the URL's ``timeout``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from orbitive.store import ErrorKind, Lock, SemaphoreLease, Store, StoreError, open_store
from orbitive.store._network import TIMEOUT_DEFAULT_S

from .._servers import TempPostgres, TempRedis
from ._faultproxy import FaultProxy

NETWORK_ENGINES = ("postgres", "redis")
#: The ``?timeout=`` of the proxied stores in the black-hole tests, in seconds.
BOUND_S = 1.0
#: What a bounded call may take beyond its timeout on this noisy VM: libpq's
#: whole-second connect timeout (at least 2 s) when a reconnect starts late.
SLACK_S = 2.5
LONG = 60.0


@dataclass
class Route:
    """A proxied store URL, a direct one, and the proxy in between."""

    proxy: FaultProxy
    proxied_url: str
    direct_url: str

    def with_timeout(self, seconds: float) -> str:
        joiner = "&" if "?" in self.proxied_url else "?"
        return f"{self.proxied_url}{joiner}timeout={seconds:g}"


@pytest.fixture(params=NETWORK_ENGINES)
def route(request: pytest.FixtureRequest) -> Iterator[Route]:
    """A fresh store URL of each network engine, and the same URL through a proxy."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    server: TempPostgres | TempRedis = request.getfixturevalue(f"{request.param}_server")
    with FaultProxy(server.port) as proxy:
        proxied = url.replace(f"127.0.0.1:{server.port}", f"127.0.0.1:{proxy.port}", 1)
        assert proxied != url
        yield Route(proxy, proxied, url)


@pytest.fixture
def proxied(route: Route) -> Iterator[Store]:
    with open_store(route.proxied_url) as store:
        yield store


@pytest.fixture
def direct(route: Route) -> Iterator[Store]:
    with open_store(route.direct_url) as store:
        yield store


def held(store: Store, name: str) -> Lock:
    lock = store.try_lock(name, "w1", LONG)
    assert lock is not None, f"{name!r} should have been free"
    return lock


# -- a reply lost after commit, a reset mid-statement ----------------------------------------

Arm = Callable[[FaultProxy], None]
FAULTS: dict[str, Arm] = {
    "lost-reply": FaultProxy.lose_next_reply,
    "reset-mid-statement": FaultProxy.reset_next_request,
}


@pytest.mark.parametrize("arm", FAULTS.values(), ids=FAULTS.keys())
def test_a_faulted_try_lock_still_grants_and_the_caller_holds_what_it_was_told(
    route: Route, proxied: Store, direct: Store, arm: Arm
) -> None:
    arm(route.proxy)
    lock = proxied.try_lock("grant", "w1", LONG)
    assert route.proxy.fired == 1
    assert lock is not None  # not None: the retry knows the committed grant is its own
    info = direct.inspect("grant")
    assert info is not None and (info.owner, info.fencing_token) == ("w1", lock.fencing_token)
    assert direct.try_lock("grant", "w2", LONG) is None
    assert lock.release()
    assert direct.inspect("grant") is None
    stats = proxied.statistics()
    assert (stats.acquired_count, stats.busy_count, stats.lost_count) == (1, 0, 0)


@pytest.mark.parametrize("arm", FAULTS.values(), ids=FAULTS.keys())
def test_a_faulted_try_lock_on_a_held_name_still_reports_it_busy(
    route: Route, proxied: Store, direct: Store, arm: Arm
) -> None:
    holder = held(direct, "taken")
    arm(route.proxy)
    assert proxied.try_lock("taken", "w2", LONG) is None
    assert route.proxy.fired == 1
    info = direct.inspect("taken")
    assert info is not None and info.fencing_token == holder.fencing_token


@pytest.mark.parametrize("arm", FAULTS.values(), ids=FAULTS.keys())
def test_a_faulted_release_returns_true_and_counts_no_loss(
    route: Route, proxied: Store, direct: Store, arm: Arm
) -> None:
    lock = held(proxied, "release")
    arm(route.proxy)
    assert lock.release() is True  # the retry finds its receipt, not a missing row
    assert route.proxy.fired == 1
    assert direct.inspect("release") is None
    stats = proxied.statistics()
    assert (stats.released_count, stats.lost_count) == (1, 0)
    successor = held(direct, "release")
    assert successor.fencing_token > lock.fencing_token


def test_a_release_retried_after_a_successor_took_the_name_still_returns_true(
    route: Route, proxied: Store, direct: Store
) -> None:
    lock = held(proxied, "quick")
    successor: list[Lock | None] = []
    # Runs in the proxy before the client hears the reset, so before the retry.
    route.proxy.lose_next_reply(
        on_fire=lambda: successor.append(direct.try_lock("quick", "w2", LONG))
    )
    assert lock.release() is True
    assert route.proxy.fired == 1
    assert successor[0] is not None and successor[0].fencing_token > lock.fencing_token
    info = direct.inspect("quick")
    assert info is not None and info.owner == "w2"  # the retry did not touch the successor
    assert lock.release() is False  # a second release stays a no-op
    assert proxied.statistics().lost_count == 0


@pytest.mark.parametrize("arm", FAULTS.values(), ids=FAULTS.keys())
def test_a_faulted_renew_keeps_the_lease_and_the_token(
    route: Route, proxied: Store, direct: Store, arm: Arm
) -> None:
    lock = held(proxied, "renew")
    arm(route.proxy)
    assert lock.renew(LONG) is True
    assert route.proxy.fired == 1
    info = direct.inspect("renew")
    assert info is not None and info.fencing_token == lock.fencing_token
    assert info.remaining_s > LONG - 5.0


@pytest.mark.parametrize("arm", FAULTS.values(), ids=FAULTS.keys())
def test_a_faulted_force_release_returns_true(
    route: Route, proxied: Store, direct: Store, arm: Arm
) -> None:
    holder = held(direct, "forced")
    arm(route.proxy)
    assert proxied.force_release("forced") is True
    assert route.proxy.fired == 1
    assert direct.inspect("forced") is None
    assert holder.release() is False


# -- a black hole: no FIN, no RST, no reply ---------------------------------------------------


def bounded_call(call: Callable[[], object], bound: float) -> float:
    """Run ``call``, which must raise StoreError(UNAVAILABLE); return the seconds it took."""
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        call()
    elapsed = time.monotonic() - started
    assert caught.value.kind is ErrorKind.UNAVAILABLE, caught.value
    assert elapsed < bound + SLACK_S, f"{elapsed:.2f} s for a {bound:g} s bound"
    return elapsed


def test_every_call_into_a_black_hole_ends_unavailable_within_the_timeout(
    route: Route, direct: Store
) -> None:
    holder = held(direct, "held")
    with open_store(route.with_timeout(BOUND_S)) as store:
        lock = held(store, "mine")
        route.proxy.black_hole()
        calls: list[Callable[[], object]] = [
            lambda: store.try_lock("free", "w1", LONG),
            lambda: lock.renew(LONG),
            lambda: store.inspect("held"),
            store.locks,
            lambda: store.force_release("held"),
            lock.release,
        ]
        for call in calls:
            bounded_call(call, BOUND_S)
        route.proxy.heal()
        assert store.try_lock("free", "w1", LONG) is not None  # a fresh connection works
    assert holder.renew(LONG)  # the black-holed force_release never reached the server


def test_the_default_timeout_bounds_a_black_holed_try_lock(route: Route, proxied: Store) -> None:
    assert TIMEOUT_DEFAULT_S <= 10.0
    route.proxy.black_hole()
    bounded_call(lambda: proxied.try_lock("n", "w1", LONG), TIMEOUT_DEFAULT_S)


def test_opening_a_store_into_a_black_hole_ends_unavailable(route: Route) -> None:
    route.proxy.black_hole()
    bounded_call(lambda: open_store(route.with_timeout(BOUND_S)), BOUND_S)


def test_a_call_waiting_for_a_black_holed_one_is_bounded_too(route: Route) -> None:
    with open_store(route.with_timeout(BOUND_S)) as store:
        route.proxy.black_hole()
        errors: list[float] = []

        def other() -> None:
            errors.append(bounded_call(lambda: store.inspect("n"), BOUND_S))

        thread = threading.Thread(target=other)
        thread.start()
        bounded_call(lambda: store.try_lock("n", "w1", LONG), BOUND_S)
        thread.join(BOUND_S + SLACK_S + 5.0)
        assert len(errors) == 1


# -- the asyncio forms: the same answers and the same bound --------------------------------


@pytest.mark.parametrize("arm", FAULTS.values(), ids=FAULTS.keys())
def test_a_faulted_try_lock_async_still_grants_and_its_release_still_returns_true(
    route: Route, proxied: Store, direct: Store, arm: Arm
) -> None:
    async def body() -> None:
        arm(route.proxy)
        lock = await proxied.try_lock_async("async-grant", "w1", LONG)
        assert lock is not None  # the retry knows the committed grant is its own
        info = direct.inspect("async-grant")
        assert info is not None and info.fencing_token == lock.fencing_token
        arm(route.proxy)
        assert await lock.release() is True  # ... and the retried release its receipt
        assert route.proxy.fired == 2

    asyncio.run(body())
    assert direct.inspect("async-grant") is None
    assert proxied.statistics().lost_count == 0


def test_every_async_call_into_a_black_hole_ends_unavailable_within_the_timeout(
    route: Route,
) -> None:
    async def body() -> None:
        with open_store(route.with_timeout(BOUND_S)) as store:
            lock = await store.try_lock_async("mine", "w1", LONG)
            assert lock is not None
            route.proxy.black_hole()
            for call in (
                lambda: store.try_lock_async("free", "w1", LONG),
                lambda: lock.renew(LONG),
                lock.release,
            ):
                started = time.monotonic()
                with pytest.raises(StoreError) as caught:
                    await call()
                elapsed = time.monotonic() - started
                assert caught.value.kind is ErrorKind.UNAVAILABLE, caught.value
                assert elapsed < BOUND_S + SLACK_S, f"{elapsed:.2f} s for a {BOUND_S:g} s bound"
            route.proxy.heal()

    asyncio.run(body())


# -- counting leases: the same answers and the same bound ------------------------------------


def held_slot(store: Store, name: str, limit: int = 2) -> SemaphoreLease:
    lease = store.semaphore(name, limit).try_acquire("w1", LONG)
    assert lease is not None, f"a slot of {name!r} should have been free"
    return lease


@pytest.mark.parametrize("arm", FAULTS.values(), ids=FAULTS.keys())
def test_a_faulted_try_acquire_still_grants_and_the_caller_holds_what_it_was_told(
    route: Route, proxied: Store, direct: Store, arm: Arm
) -> None:
    arm(route.proxy)
    lease = proxied.semaphore("units", 2).try_acquire("w1", LONG)
    assert route.proxy.fired == 1
    assert lease is not None  # the retry knows the committed grant is its own
    holders = direct.semaphore("units", 2).holders()
    assert [(h.slot, h.owner, h.fencing_token) for h in holders] == [
        (lease.slot, "w1", lease.fencing_token)
    ]
    assert lease.release()
    stats = proxied.statistics()
    assert (stats.acquired_count, stats.busy_count, stats.lost_count) == (1, 0, 0)


@pytest.mark.parametrize("arm", FAULTS.values(), ids=FAULTS.keys())
def test_a_faulted_try_acquire_on_a_full_semaphore_still_reports_it_full(
    route: Route, proxied: Store, direct: Store, arm: Arm
) -> None:
    holder = held_slot(direct, "full", 1)
    arm(route.proxy)
    assert proxied.semaphore("full", 1).try_acquire("w2", LONG) is None
    assert route.proxy.fired == 1
    holders = direct.semaphore("full", 1).holders()
    assert [h.fencing_token for h in holders] == [holder.fencing_token]


@pytest.mark.parametrize("arm", FAULTS.values(), ids=FAULTS.keys())
def test_a_faulted_unit_release_returns_true_and_counts_no_loss(
    route: Route, proxied: Store, direct: Store, arm: Arm
) -> None:
    lease = held_slot(proxied, "release")
    arm(route.proxy)
    assert lease.release() is True  # the retry finds its receipt, not a missing field
    assert route.proxy.fired == 1
    assert direct.semaphore("release", 2).holders() == []
    stats = proxied.statistics()
    assert (stats.released_count, stats.lost_count) == (1, 0)


@pytest.mark.parametrize("arm", FAULTS.values(), ids=FAULTS.keys())
def test_a_faulted_unit_renew_keeps_the_slot_and_the_token(
    route: Route, proxied: Store, direct: Store, arm: Arm
) -> None:
    lease = held_slot(proxied, "renew")
    arm(route.proxy)
    assert lease.renew(LONG) is True
    assert route.proxy.fired == 1
    (info,) = direct.semaphore("renew", 2).holders()
    assert (info.slot, info.fencing_token) == (lease.slot, lease.fencing_token)
    assert info.remaining_s > LONG - 5.0


def test_every_semaphore_call_into_a_black_hole_ends_unavailable_within_the_timeout(
    route: Route, direct: Store
) -> None:
    holder = held_slot(direct, "busy", 1)
    with open_store(route.with_timeout(BOUND_S)) as store:
        lease = held_slot(store, "mine")
        route.proxy.black_hole()
        sem = store.semaphore("mine", 2)
        calls: list[Callable[[], object]] = [
            lambda: sem.try_acquire("w2", LONG),
            lambda: lease.renew(LONG),
            sem.holders,
            store.semaphores,
            lease.release,
            lambda: store.semaphore("busy", 1).acquire(ttl=LONG, timeout=30.0),
        ]
        for call in calls:
            bounded_call(call, BOUND_S)
        route.proxy.heal()
        assert sem.try_acquire("w2", LONG) is not None  # a fresh connection works
    assert holder.renew(LONG)


@pytest.mark.parametrize("arm", FAULTS.values(), ids=FAULTS.keys())
def test_a_faulted_try_acquire_async_still_grants_and_its_release_still_returns_true(
    route: Route, proxied: Store, direct: Store, arm: Arm
) -> None:
    async def body() -> None:
        arm(route.proxy)
        lease = await proxied.semaphore("async-units", 2).try_acquire_async("w1", LONG)
        assert lease is not None  # the retry knows the committed grant is its own
        holders = direct.semaphore("async-units", 2).holders()
        assert [h.fencing_token for h in holders] == [lease.fencing_token]
        arm(route.proxy)
        assert await lease.release() is True  # ... and the retried release its receipt
        assert route.proxy.fired == 2

    asyncio.run(body())
    assert direct.semaphore("async-units", 2).holders() == []
    assert proxied.statistics().lost_count == 0


def test_every_async_semaphore_call_into_a_black_hole_ends_unavailable_within_the_timeout(
    route: Route, direct: Store
) -> None:
    holder = held_slot(direct, "busy", 1)

    async def body() -> None:
        with open_store(route.with_timeout(BOUND_S)) as store:
            sem = store.semaphore("mine", 2)
            lease = await sem.try_acquire_async("w1", LONG)
            assert lease is not None
            route.proxy.black_hole()

            async def waiting() -> object:
                async with store.semaphore("busy", 1).acquire_async(ttl=LONG, timeout=30.0):
                    return None

            for call in (
                lambda: sem.try_acquire_async("w2", LONG),
                lambda: lease.renew(LONG),
                lease.release,
                waiting,
            ):
                started = time.monotonic()
                with pytest.raises(StoreError) as caught:
                    await call()
                elapsed = time.monotonic() - started
                assert caught.value.kind is ErrorKind.UNAVAILABLE, caught.value
                assert elapsed < BOUND_S + SLACK_S, f"{elapsed:.2f} s for a {BOUND_S:g} s bound"
            route.proxy.heal()
            assert await sem.try_acquire_async("w2", LONG) is not None  # a fresh connection

    asyncio.run(body())
    assert holder.renew(LONG)
