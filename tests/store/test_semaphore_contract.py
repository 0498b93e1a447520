"""Counting leases (issue 23 item 1): the store contract for each holder, run on every engine.

Up to ``limit`` holders of one name, each with its own slot, TTL, owner compare,
renew, release and a fencing token larger than every earlier one of the name; one
limit per name; a namespace apart from the named locks.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from orbitive import OrbitError
from orbitive._core._errors import InvalidTtl
from orbitive.store import (
    ErrorKind,
    InvalidLockName,
    InvalidLockOwner,
    InvalidSemaphoreLimit,
    LockTimeout,
    SemaphoreLease,
    SemaphoreLimitMismatch,
    SlotInfo,
    Store,
    StoreError,
    open_store,
)
from orbitive.store._engine import Busy
from orbitive.store._shm import SHM_LIMIT_MAX
from orbitive.store._url import open_engine

from .test_contract import BAD_NAMES, BAD_OWNERS, BAD_TTLS

#: Long enough never to lapse during a test.
LONG = 60.0
#: Short enough to lapse quickly, long enough to act within.
SHORT = 0.5
#: How soon a waiter woken by a release holds its slot, in seconds.
WOKEN_S = 0.2
#: The same on SHM, whose waiters pause at most 0.25 s (``ShmEngine.poll_cap_s``): measured
#: on 2 cores at a load average of 18 (two CPU burners and other test runs), 120 wakes of
#: three waiter threads took 0.5 ms at the median, 32 ms at the 99th percentile, 35 ms at
#: most; a waiter woken by its next poll instead is 0-0.25 s late, under 0.1 s about
#: half the time.
WOKEN_SHM_S = 0.1
BAD_LIMITS = [0, -1, 4097, True, 2.0, "3", None]


def held(
    store: Store, name: str, limit: int, owner: str = "w1", ttl: float = LONG
) -> SemaphoreLease:
    lease = store.semaphore(name, limit).try_acquire(owner, ttl)
    assert lease is not None, f"a slot of {name!r} should have been free"
    return lease


def lapse(*leases: SemaphoreLease) -> None:
    """Sleep until every lease's window has passed, with a margin."""
    time.sleep(max(lease.remaining() for lease in leases) + 0.1)


def slots(store: Store, name: str) -> list[tuple[int, str]]:
    return [(info.slot, info.owner) for info in store.semaphore(name, 1).holders()]


# -- counting ----------------------------------------------------------------------------------


def test_up_to_limit_holders_each_in_its_own_slot_then_none(store: Store, other: Store) -> None:
    sem = store.semaphore("payments-api", limit=3)
    leases = [sem.try_acquire(f"w{index}", LONG) for index in range(3)]
    assert all(isinstance(lease, SemaphoreLease) for lease in leases)
    assert sorted(lease.slot for lease in leases if lease is not None) == [0, 1, 2]
    assert sem.try_acquire("w3", LONG) is None
    assert other.semaphore("payments-api", 3).try_acquire("w4", LONG) is None
    assert slots(store, "payments-api") == [(0, "w0"), (1, "w1"), (2, "w2")]


def test_the_lease_reports_its_tenure(store: Store) -> None:
    lease = held(store, "jobs", 2, "worker-1", 30.0)
    assert (lease.name, lease.owner, lease.slot) == ("jobs", "worker-1", 0)
    assert isinstance(lease.fencing_token, int) and lease.fencing_token > 0
    assert 29.0 < lease.remaining() <= 30.0
    assert not lease.lost
    assert "SemaphoreLease" in repr(lease) and "'jobs'" in repr(lease)


def test_one_owner_may_hold_several_slots(store: Store) -> None:
    sem = store.semaphore("s", 2)
    first, second = sem.try_acquire("same", LONG), sem.try_acquire("same", LONG)
    assert first is not None and second is not None and first.slot != second.slot
    assert sem.try_acquire("same", LONG) is None


def test_a_release_frees_its_slot_and_the_lowest_free_slot_is_taken(store: Store) -> None:
    sem = store.semaphore("s", 3)
    leases = [sem.try_acquire(f"w{index}", LONG) for index in range(3)]
    assert leases[1] is not None and leases[1].release() is True
    again = sem.try_acquire("w9", LONG)
    assert again is not None and again.slot == 1
    assert leases[0] is not None and leases[0].release()
    assert [slot for slot, _ in slots(store, "s")] == [1, 2]
    latest = sem.try_acquire("w10", LONG)
    assert latest is not None and latest.slot == 0


def test_fencing_tokens_strictly_increase_across_slots_and_names(store: Store) -> None:
    tokens = []
    for index in range(8):
        lease = held(store, f"name-{index % 2}", 4, f"w{index}")
        tokens.append(lease.fencing_token)
        if index % 3 == 0:
            assert lease.release()
    lock = store.try_lock("a-lock", "w1", LONG)
    assert lock is not None
    tokens.append(lock.fencing_token)
    assert tokens == sorted(set(tokens))  # one counter per store: locks and semaphores


def test_expires_at_is_on_the_engine_clock(store: Store, store_url: str) -> None:
    clock = time.monotonic if store_url.startswith("shm:") else time.time
    lease = held(store, "clock", 2, ttl=10.0)
    assert abs(lease.expires_at - (clock() + 10.0)) < 1.0


# -- renew, release, lapse ---------------------------------------------------------------------


def test_renew_sets_a_new_full_window_from_now_and_keeps_token_and_slot(store: Store) -> None:
    lease = held(store, "r", 2, ttl=30.0)
    first_expiry, token = lease.expires_at, lease.fencing_token
    assert lease.renew(2.0) is True
    assert lease.remaining() <= 2.0 and lease.expires_at < first_expiry
    (info,) = store.semaphore("r", 2).holders()
    assert info.remaining_s <= 2.0 and info.fencing_token == token
    assert lease.renew(40.0) is True
    assert 39.0 < lease.remaining() <= 40.0
    assert (lease.fencing_token, lease.slot) == (token, 0)


def test_renew_after_ttl_returns_false_even_if_nobody_took_the_slot(store: Store) -> None:
    lease = held(store, "r", 2, ttl=SHORT)
    lapse(lease)
    assert lease.renew(LONG) is False
    assert lease.lost
    assert store.semaphore("r", 2).holders() == []


def test_a_lapsed_slot_goes_to_the_next_holder_with_a_larger_token(
    store: Store, other: Store
) -> None:
    first = held(store, "lapse", 1, ttl=SHORT)
    assert other.semaphore("lapse", 1).try_acquire("w2", LONG) is None
    lapse(first)
    second = held(other, "lapse", 1, "w2")
    assert second.slot == first.slot and second.fencing_token > first.fencing_token
    assert first.renew(LONG) is False
    assert first.release() is False  # the successor is untouched
    assert slots(store, "lapse") == [(0, "w2")]
    assert second.release() is True


def test_same_owner_string_does_not_renew_or_release_another_tenure(store: Store) -> None:
    first = held(store, "r", 1, "same", SHORT)
    lapse(first)
    second = held(store, "r", 1, "same", 30.0)
    assert first.renew(LONG) is False
    assert first.release() is False
    (info,) = store.semaphore("r", 1).holders()
    assert info.fencing_token == second.fencing_token and info.remaining_s <= 30.0
    assert second.release() is True


def test_a_batched_renewal_renews_the_new_tenure_of_a_slot_not_the_forgotten_one(
    store_url: str,
) -> None:
    """A holder granted a slot again after its first tenure of it was forgotten (the row
    gone, as after a failover) holds both grants; renewing both in one batch renews only
    the live tenure, matched by slot and fencing token (the PostgreSQL engine matched by
    slot alone and renewed the forgotten one too, for good)."""
    engine = open_engine(store_url)
    try:
        first = engine.acquire_unit("forgot", 2, "host", LONG)
        assert not isinstance(first, Busy)
        assert engine.release_units("forgot", "host", [first]) == [True]  # forgotten
        second = engine.acquire_unit("forgot", 2, "host", LONG)
        assert not isinstance(second, Busy)
        assert (second.slot, second.fencing_token) == (first.slot, second.fencing_token)
        assert second.fencing_token > first.fencing_token
        old, new = engine.renew_units("forgot", "host", [first, second], LONG)
        assert old is None
        assert new is not None and new.fencing_token == second.fencing_token
    finally:
        engine.close()


def test_second_release_returns_false(store: Store) -> None:
    lease = held(store, "rel", 2)
    assert lease.release() is True
    assert lease.release() is False
    assert lease.renew(LONG) is False
    assert store.semaphore("rel", 2).holders() == []


def test_a_lease_as_context_manager_releases(store: Store) -> None:
    with held(store, "ctx", 2) as lease:
        assert lease.slot == 0 and len(store.semaphore("ctx", 2).holders()) == 1
    assert store.semaphore("ctx", 2).holders() == []
    assert lease.release() is False


# -- one limit per name ----------------------------------------------------------------------


def test_another_limit_while_held_is_a_named_error_that_takes_nothing(
    store: Store, other: Store
) -> None:
    holder = held(store, "pool", 2)
    with pytest.raises(SemaphoreLimitMismatch) as caught:
        other.semaphore("pool", 3).try_acquire("w2", LONG)
    error = caught.value
    assert isinstance(error, StoreError) and error.kind is ErrorKind.INVALID_INPUT
    assert (error.limit, error.found, error.key) == (3, 2, "pool")
    assert "pool" in str(error) and "2" in str(error)
    with pytest.raises(SemaphoreLimitMismatch):
        other.semaphore("pool", 1).acquire(ttl=LONG, timeout=5.0)  # not a wait: at once
    assert slots(store, "pool") == [(0, "w1")]
    assert holder.renew(LONG)


def test_another_limit_is_refused_whichever_slot_the_holders_have(store: Store) -> None:
    low, high = held(store, "gap", 3, "a"), held(store, "gap", 3, "b")
    assert low.release()  # slot 0 is free, slot 1 is held
    for limit in (1, 2, 4):
        with pytest.raises(SemaphoreLimitMismatch):
            store.semaphore("gap", limit).try_acquire("x", LONG)
    assert slots(store, "gap") == [(1, "b")]
    assert high.release()


def test_once_every_holder_released_a_new_limit_is_accepted(store: Store) -> None:
    leases = [held(store, "resize", 2, f"w{index}") for index in range(2)]
    for lease in leases:
        assert lease.release()
    grown = store.semaphore("resize", 4)
    taken = [grown.try_acquire(f"v{index}", LONG) for index in range(5)]
    assert [lease.slot for lease in taken if lease is not None] == [0, 1, 2, 3]
    assert taken[4] is None
    with pytest.raises(SemaphoreLimitMismatch):
        store.semaphore("resize", 2).try_acquire("old", LONG)


def test_once_every_holder_lapsed_a_new_limit_is_accepted(store: Store) -> None:
    lease = held(store, "resize", 3, ttl=SHORT)
    lapse(lease)
    smaller = held(store, "resize", 1, "new")
    assert smaller.fencing_token > lease.fencing_token
    assert store.semaphore("resize", 1).try_acquire("w3", LONG) is None


Outcome = SemaphoreLease | SemaphoreLimitMismatch | None


def race(racers: list[tuple[Store, int]], name: str) -> list[tuple[int, Outcome]]:
    """One try_acquire of ``name`` per (client, limit), started at once from threads: each
    racer's limit and outcome."""
    barrier, outcomes = threading.Barrier(len(racers)), list[tuple[int, Outcome]]()

    def attempt(client: Store, limit: int, owner: str) -> None:
        barrier.wait()
        try:
            outcomes.append((limit, client.semaphore(name, limit).try_acquire(owner, LONG)))
        except SemaphoreLimitMismatch as error:
            outcomes.append((limit, error))

    threads = [
        threading.Thread(target=attempt, args=(client, limit, f"w{index}"))
        for index, (client, limit) in enumerate(racers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30.0)
    return outcomes


def test_two_limits_racing_for_a_free_name_never_mix(
    store: Store, other: Store, store_url: str
) -> None:
    """Four clients, two limits, one free name per round: the holders were granted under
    one limit, which the name reports, and each refused client gets the named error naming
    the other limit (in a close race both sides may back off: refusing is safe, mixing is
    not). No racer finds the name full, but on SHM: a racer that found the other limit's
    marker first may take a free slot and hold it for a moment, until its check sees the
    marker replaced and it is refused; a racer of the new limit that looked at the slots
    meanwhile found them all held (``store/_shm.py``)."""
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads of one process interleave within a grant
    try:
        for round_ in range(20):
            name = f"mixed-{round_}"
            outcomes = race([(store, 2), (other, 3), (store, 3), (other, 2)], name)
            holders = store.semaphore(name, 1).holders()
            granted = {limit for limit, outcome in outcomes if isinstance(outcome, SemaphoreLease)}
            assert len(granted) <= 1 and {info.limit for info in holders} <= granted
            assert all(info.slot < info.limit for info in holders)
            leases = [outcome for _, outcome in outcomes if isinstance(outcome, SemaphoreLease)]
            assert sorted(lease.owner for lease in leases) == sorted(i.owner for i in holders)
            refused = [out for _, out in outcomes if isinstance(out, SemaphoreLimitMismatch)]
            assert all(error.found == 5 - error.limit for error in refused)  # the other one
            assert len(outcomes) == 4
            for limit in (limit for limit, outcome in outcomes if outcome is None):
                assert store_url.startswith("shm:"), "never busy: 2 racers of each limit"
                assert any(error.limit == 5 - limit for error in refused)  # gave a slot back
    finally:
        sys.setswitchinterval(switch)


# -- names, owners, limits, durations ----------------------------------------------------------


def test_a_semaphore_and_a_lock_of_one_name_are_unrelated(store: Store) -> None:
    lock = store.try_lock("shared", "w1", LONG)
    assert lock is not None
    lease = held(store, "shared", 1)
    assert store.try_lock("shared", "w2", LONG) is None  # the lock is still the lock's
    assert [info.name for info in store.locks()] == ["shared"]
    assert [(info.name, info.slot) for info in store.semaphores()] == [("shared", 0)]
    assert lock.release() and store.semaphores() != []
    assert lease.release() and store.semaphores() == []


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_bad_names_are_refused_before_the_engine(store: Store, name: object) -> None:
    with pytest.raises(InvalidLockName) as caught:
        store.semaphore(name, 2)  # type: ignore[arg-type]
    assert caught.value.kind is ErrorKind.INVALID_INPUT
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, OrbitError)


@pytest.mark.parametrize("limit", BAD_LIMITS, ids=repr)
def test_a_limit_must_be_an_int_from_1_to_4096(store: Store, limit: object) -> None:
    with pytest.raises(InvalidSemaphoreLimit) as caught:
        store.semaphore("n", limit)  # type: ignore[arg-type]
    assert caught.value.kind is ErrorKind.INVALID_INPUT
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, TypeError)
    most = SHM_LIMIT_MAX if store.url.startswith("shm://") else 4096  # the table's 256 names
    assert store.semaphore("n", most).limit == most


@pytest.mark.parametrize("owner", BAD_OWNERS, ids=repr)
def test_owner_must_be_a_non_empty_string(store: Store, owner: object) -> None:
    sem = store.semaphore("n", 2)
    with pytest.raises(InvalidLockOwner):
        sem.try_acquire(owner, LONG)  # type: ignore[arg-type]
    if owner is not None:  # None: acquire() makes a fresh owner
        with pytest.raises(InvalidLockOwner):
            sem.acquire(owner, LONG, timeout=0)  # type: ignore[arg-type]
    assert sem.holders() == []


@pytest.mark.parametrize("ttl", BAD_TTLS, ids=repr)
def test_bad_ttl_is_a_database_error_that_grants_and_changes_nothing(
    store: Store, ttl: object
) -> None:
    sem = store.semaphore("guarded", 2)
    with pytest.raises(StoreError) as caught:
        sem.try_acquire("w1", ttl)  # type: ignore[arg-type]
    assert caught.value.kind is ErrorKind.DATABASE
    assert isinstance(caught.value.__cause__, InvalidTtl)
    assert sem.holders() == []
    lease = held(store, "guarded", 2)
    before = sem.holders()
    with pytest.raises(StoreError) as renewing:
        lease.renew(ttl)  # type: ignore[arg-type]
    assert renewing.value.kind is ErrorKind.DATABASE
    assert [(info.fencing_token, info.expires_at) for info in sem.holders()] == [
        (info.fencing_token, info.expires_at) for info in before
    ]


def test_the_guards_fire_before_the_closed_engine_is_touched(store_url: str) -> None:
    store = open_store(store_url)
    sem = store.semaphore("n", 2)
    store.close()
    with pytest.raises(StoreError) as caught:
        sem.try_acquire("w1", -1.0)
    assert caught.value.kind is ErrorKind.DATABASE
    for call in (lambda: sem.try_acquire("w1", 1.0), sem.holders, store.semaphores):
        with pytest.raises(StoreError) as closed:
            call()
        assert closed.value.kind is ErrorKind.CLOSED


def test_the_engines_own_guard_keeps_its_message_in_the_cause(store: Store) -> None:
    engine = store._backend.engine  # bypass the contract's guard on purpose
    with pytest.raises(StoreError) as caught:
        engine.acquire_unit("raw", 2, "w1", 0.0)
    assert caught.value.kind is ErrorKind.DATABASE
    assert caught.value.__cause__ is not None
    assert store.semaphore("raw", 2).holders() == []


def test_a_sub_millisecond_ttl_counts_as_one_millisecond(store: Store) -> None:
    lease = held(store, "tiny", 1, ttl=1e-9)
    assert lease.remaining() <= 0.001
    time.sleep(0.05)
    assert lease.renew(1e-7) is False
    assert held(store, "tiny", 1).fencing_token > lease.fencing_token


# -- inspection ----------------------------------------------------------------------------------


def test_holders_and_semaphores_show_live_holders_by_name_and_slot(store: Store) -> None:
    short = held(store, "b", 2, "w1", SHORT)
    held(store, "b", 2, "w2")
    held(store, "a", 1, "w3")
    found = store.semaphores()
    assert all(isinstance(info, SlotInfo) for info in found)
    assert [(i.name, i.slot, i.limit, i.owner) for i in found] == [
        ("a", 0, 1, "w3"),
        ("b", 0, 2, "w1"),
        ("b", 1, 2, "w2"),
    ]
    assert found[1].fencing_token == short.fencing_token and 0 < found[1].remaining_s <= SHORT
    lapse(short)
    assert [(i.name, i.slot) for i in store.semaphores()] == [("a", 0), ("b", 1)]
    assert [i.owner for i in store.semaphore("b", 2).holders()] == ["w2"]
    assert store.semaphore("never", 3).holders() == []


def test_statistics_count_semaphore_leases(store: Store) -> None:
    sem = store.semaphore("s", 1)
    lease = sem.try_acquire("w1", LONG)
    assert lease is not None and sem.try_acquire("w2", LONG) is None
    assert lease.renew(LONG)
    stats = store.statistics()
    assert (stats.acquired_count, stats.busy_count, stats.renewed_count) == (1, 1, 1)
    assert stats.held_count == 1
    assert lease.release()
    assert (store.statistics().held_count, store.statistics().released_count) == (0, 1)


def test_repr_names_the_semaphore(store: Store) -> None:
    assert repr(store.semaphore("pay", 5)).startswith("<Semaphore 'pay' limit=5 on ")


# -- the blocking helper -----------------------------------------------------------------------


def test_acquire_waits_then_times_out_naming_the_semaphore(store: Store) -> None:
    held(store, "full", 1)
    started = time.monotonic()
    with pytest.raises(LockTimeout) as caught:
        store.semaphore("full", 1).acquire(ttl=LONG, timeout=0.3)
    assert 0.25 <= time.monotonic() - started < 3.0
    assert "semaphore 'full'" in str(caught.value) and "1 slots" in str(caught.value)
    with pytest.raises(LockTimeout):
        store.semaphore("full", 1).acquire(ttl=LONG, timeout=0)


def test_acquire_as_context_manager_holds_renews_and_releases(store: Store) -> None:
    sem = store.semaphore("auto", 2)
    with sem.acquire(ttl=0.3, timeout=5.0) as lease:
        assert isinstance(lease, SemaphoreLease) and lease.owner.count(":") == 2
        time.sleep(0.8)  # beyond the ttl: the renewer kept it
        assert not lease.lost
        assert [info.fencing_token for info in sem.holders()] == [lease.fencing_token]
    assert sem.holders() == []
    assert store.statistics().renewed_count >= 1


def test_a_lease_without_renewal_lapses_and_a_refused_renewal_calls_on_lost(store: Store) -> None:
    lost: list[SemaphoreLease] = []
    lease = store.semaphore("once", 1).acquire(
        ttl=SHORT, timeout=1.0, auto_renew=False, on_lost=lost.append
    )
    lapse(lease)
    assert lease.lost
    assert lease.renew(LONG) is False
    assert lost == [lease]  # a refused renewal calls back


def woken_after_releases(store: Store, rounds: int) -> list[float]:
    """Seconds from each release to its waiter holding the slot: ``rounds`` names, each
    held, each with a waiter whose pauses have reached their cap (1 s while
    notifications arrive; 50 ms on SQLite, which polls), released a third of that cap
    apart (waiters polling in step could not all be on time)."""
    names = [f"wake-{n}" for n in range(rounds)]
    holders = [held(store, name, 1, ttl=LONG) for name in names]
    woken: dict[str, float] = {}

    def wait(name: str) -> None:
        with store.semaphore(name, 1).acquire(ttl=LONG, timeout=20.0):
            woken[name] = time.monotonic()

    waiters = [threading.Thread(target=wait, args=(name,)) for name in names]
    for waiter in waiters:
        waiter.start()
    time.sleep(2.0)
    late: list[float] = []
    for name, holder, waiter in zip(names, holders, waiters, strict=True):
        released = time.monotonic()
        assert holder.release()
        waiter.join(20.0)
        late.append(woken[name] - released)
        time.sleep(0.33)
    return late


def test_a_waiter_is_woken_by_a_release_not_by_its_next_poll(store: Store, store_url: str) -> None:
    # Woken by polling, a waiter would hold the slot a uniform 0-1 s after the release
    # (0-0.25 s on SHM): under the bound in each of three rounds with a chance of about
    # 1 in 125 (1 in 8 on SHM).
    bound = WOKEN_SHM_S if store_url.startswith("shm://") else WOKEN_S
    for round_no, late in enumerate(woken_after_releases(store, 3)):
        assert late < bound, f"round {round_no}: woken {late:.3f} s after the release"


def test_a_shm_waiter_is_woken_by_a_release_another_waiter_of_its_process_drained(
    shm_url: str,
) -> None:
    """The readiness descriptor is one per process: a waiter that looked, found the slot
    held and is about to wait is still woken by a release whose signal another waiter
    thread's look drained first (it waited out its pause, 0.125-0.25 s, before)."""
    engine = open_engine(shm_url)
    try:
        holder = engine.acquire_unit("drained", 1, "holder", LONG)
        assert not isinstance(holder, Busy)
        waiter = engine.unit_waiter("drained")
        waiter.look()
        busy = engine.acquire_unit("drained", 1, "waiter", LONG)
        assert isinstance(busy, Busy)
        assert engine.release_units("drained", "holder", [holder]) == [True]
        engine.unit_waiter("other").look()  # another thread's waiter, before its attempt
        started = time.monotonic()
        waiter.wait(busy, LONG, tries=20)  # a pause at its cap
        waited = time.monotonic() - started
    finally:
        engine.close()
    assert waited < 0.05, f"waited {waited:.3f} s after a release it missed"


def test_a_holder_that_lapses_frees_a_waiter_by_its_expiry(store: Store) -> None:
    holder = held(store, "dead", 1, ttl=1.5)  # never released: as if its process died
    started = time.monotonic()
    with store.semaphore("dead", 1).acquire(ttl=LONG, timeout=20.0) as lease:
        waited = time.monotonic() - started
        assert lease.fencing_token > holder.fencing_token
    assert holder.remaining() == 0.0
    assert 1.0 < waited < 1.5 + 0.3, f"waited {waited:.3f} s for a lease of 1.5 s"


def test_closing_the_store_ends_a_waiting_acquire_with_closed(store_url: str) -> None:
    store = open_store(store_url)
    held(store, "wanted", 1)
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            store.semaphore("wanted", 1).acquire(ttl=1.0, timeout=10.0)
        except BaseException as error:  # recorded for the assertion
            outcome.append(error)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)
    store.close()
    waiter.join(15.0)
    assert not waiter.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], StoreError), outcome
    assert outcome[0].kind is ErrorKind.CLOSED


def test_forked_child_takes_a_slot_on_its_own_connection(store: Store) -> None:
    parent = held(store, "family", 2, "parent")
    pid = os.fork()
    if pid == 0:  # child: exit status tells the parent what happened
        code = 1
        try:
            sem = store.semaphore("family", 2)
            child = sem.try_acquire("kid", LONG)
            if child is not None and child.slot == 1 and sem.try_acquire("kid", LONG) is None:
                code = 0 if child.release() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert parent.renew(LONG)  # the parent's connection is intact
    assert slots(store, "family") == [(0, "parent")]
