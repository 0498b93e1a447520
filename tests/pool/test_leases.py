"""Reservations, accepts and completions: who may do what, and what comes back when."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from orbitive import Fleet
from orbitive._core._errors import (
    BusyError,
    DrainingError,
    MalformedError,
    NotOwnerError,
    NotReservedError,
    StaleError,
)
from orbitive.pool import Key, Lease, Pool

from ._agent import Agent, rid_of

KEY = Key(0x1234_5678)


def test_exclusive_resource_leased_once_accepted_once_freed_only_by_owner(
    shm_pool: Pool, agents: Callable[[], Agent]
) -> None:
    owner = agents()
    rid = rid_of(owner.call("register", KEY, 1))
    lease = shm_pool.reserve(rid)
    assert lease.fence == 1
    assert (lease.holder_node, lease.holder_incarnation) == (shm_pool.node, shm_pool.incarnation)
    with pytest.raises(BusyError):
        shm_pool.reserve(rid)
    with pytest.raises(NotOwnerError):
        shm_pool.accept(lease)  # only the owner accepts
    handle = owner.call("accept", lease)
    with pytest.raises(NotReservedError):
        owner.call("accept", lease)  # exactly once per fence
    [candidate] = shm_pool.candidates(KEY)
    assert (candidate.reserved, candidate.active, candidate.free) == (0, 1, 0)
    with pytest.raises(BusyError):
        shm_pool.reserve(rid)  # an accepted unit is not free either
    owner.call("complete", handle)
    [candidate] = shm_pool.candidates(KEY)
    assert (candidate.reserved, candidate.active, candidate.free) == (0, 0, 1)
    assert shm_pool.reserve(rid).fence == 2  # fences grow per reservation


def test_fences_grow_per_reservation_on_each_resource(pool: Pool) -> None:
    rid = pool.register(KEY, 4)
    other = pool.register(KEY, 4)
    fences = [pool.reserve(rid).fence for _ in range(4)]
    assert fences == [1, 2, 3, 4]
    assert pool.reserve(other).fence == 1


def test_capacity_three_fourth_busy_drain_refuses_unregister_makes_stale(pool: Pool) -> None:
    rid = pool.register(KEY, 3)
    leases = [pool.reserve(rid) for _ in range(3)]
    with pytest.raises(BusyError):
        pool.reserve(rid)
    execution = pool.accept(leases[0])
    pool.drain(rid)
    with pytest.raises(DrainingError):
        pool.reserve(rid)
    with pytest.raises(DrainingError):
        pool.accept(leases[1])
    [candidate] = pool.candidates(KEY)
    assert candidate.state == "draining"
    execution.complete()  # a running execution finishes normally
    assert pool.candidates(KEY)[0].active == 0
    pool.unregister(rid)
    assert pool.candidates(KEY) == []
    with pytest.raises(StaleError):
        pool.accept(leases[2])
    with pytest.raises(StaleError):
        pool.reserve(rid)
    with pytest.raises(StaleError):
        pool.unregister(rid)


def test_reused_slot_makes_old_id_and_lease_stale(fleet: Fleet) -> None:
    pool = Pool(fleet, kind=201, lane_capacity=1)  # one slot: the next register reuses it
    old = pool.register(KEY, 1)
    lease = pool.reserve(old)
    pool.unregister(old)
    new = pool.register(KEY, 1)
    assert (new.node, new.slot) == (old.node, old.slot)
    assert new.generation == old.generation + 1
    for call in (lambda: pool.reserve(old), lambda: pool.accept(lease)):
        with pytest.raises(StaleError):
            call()
    assert pool.reserve(new).fence == 1
    pool.close()


def test_capacity_three_across_processes_fourth_busy_drain_refuses_unregister_stales(
    shm_pool: Pool, agents: Callable[..., Agent]
) -> None:
    owner = agents()
    borrowers = [agents() for _ in range(4)]
    rid = rid_of(owner.call("register", KEY, 3))
    for borrower in borrowers:
        borrower.send("reserve", rid)  # all four in flight at once
    leases: dict[Agent, Lease] = {}
    busy: list[Agent] = []
    for borrower in borrowers:
        try:
            leases[borrower] = borrower.reply()
        except BusyError:
            busy.append(borrower)
    assert (len(leases), len(busy)) == (3, 1)
    assert sorted(lease.fence for lease in leases.values()) == [1, 2, 3]
    for borrower, lease in leases.items():
        assert (lease.holder_node, lease.holder_incarnation) == (
            borrower.node,
            borrower.incarnation,
        )
    [candidate] = shm_pool.candidates(KEY)
    assert (candidate.reserved, candidate.active, candidate.free) == (3, 0, 0)
    first, second, third = leases.values()
    handle = owner.call("accept", first)
    with pytest.raises(BusyError):
        busy[0].call("reserve", rid)  # accepted units are not free either
    owner.call("drain", rid)
    with pytest.raises(DrainingError):
        busy[0].call("reserve", rid)
    with pytest.raises(DrainingError):
        owner.call("accept", second)
    [candidate] = shm_pool.candidates(KEY)
    assert (candidate.state, candidate.reserved, candidate.active) == ("draining", 2, 1)
    owner.call("complete", handle)  # a running execution finishes normally
    assert shm_pool.candidates(KEY)[0].active == 0
    owner.call("unregister", rid)
    assert shm_pool.candidates(KEY) == []
    holder = next(b for b, lease in leases.items() if lease == third)
    stale_calls: list[Callable[[], object]] = [
        lambda: owner.call("accept", third),
        lambda: holder.call("cancel", third),
        lambda: busy[0].call("reserve", rid),
        lambda: owner.call("unregister", rid),
    ]
    for call in stale_calls:
        with pytest.raises(StaleError):
            call()


def test_reused_slot_across_processes_makes_old_id_and_lease_stale(
    agents: Callable[..., Agent],
) -> None:
    owner = agents(kind=201, lane_capacity=1)  # one slot: the next register reuses it
    borrower = agents(kind=201, lane_capacity=1)
    old = rid_of(owner.call("register", KEY, 1))
    lease = borrower.call("reserve", old)
    owner.call("unregister", old)
    new = rid_of(owner.call("register", KEY, 1))
    assert (new.node, new.slot) == (old.node, old.slot)
    assert new.generation == old.generation + 1
    stale_calls: list[Callable[[], object]] = [
        lambda: borrower.call("reserve", old),
        lambda: borrower.call("cancel", lease),
        lambda: owner.call("accept", lease),
        lambda: owner.call("unregister", old),
    ]
    for call in stale_calls:
        with pytest.raises(StaleError):
            call()
    [candidate] = borrower.call("candidates", KEY)
    assert (candidate.id, candidate.reserved, candidate.active) == (new, 0, 0)
    fresh = borrower.call("reserve", new)
    assert fresh.fence == 1  # the new resource's own fences
    owner.call("complete", owner.call("accept", fresh))
    assert borrower.call("candidates", KEY)[0].free == 1


def test_sixteen_pending_reservations_per_resource_then_busy_until_one_is_accepted(
    shm_pool: Pool, agents: Callable[..., Agent]
) -> None:
    owner, other = agents(), agents()
    rid = rid_of(owner.call("register", KEY, 100))
    leases = [shm_pool.reserve(rid) for _ in range(8)]
    leases += [other.call("reserve", rid) for _ in range(8)]
    assert [lease.fence for lease in leases] == list(range(1, 17))
    [candidate] = shm_pool.candidates(KEY)
    assert (candidate.capacity, candidate.reserved, candidate.active) == (100, 16, 0)
    busy_calls: list[Callable[[], object]] = [
        lambda: shm_pool.reserve(rid),
        lambda: other.call("reserve", rid),
    ]
    for call in busy_calls:
        with pytest.raises(BusyError):
            call()  # every pending entry is taken, though 84 units are unused
    handle = owner.call("accept", leases[0])
    assert shm_pool.reserve(rid).fence == 17  # the accepted entry is free again
    with pytest.raises(BusyError):
        other.call("reserve", rid)
    [candidate] = shm_pool.candidates(KEY)
    assert (candidate.reserved, candidate.active) == (16, 1)
    owner.call("complete", handle)
    with pytest.raises(BusyError):
        shm_pool.reserve(rid)  # a completion frees a unit, not a pending entry
    shm_pool.cancel_reservation(leases[1])
    assert other.call("reserve", rid).fence == 18


def test_completion_after_slot_reuse_returns_nothing_to_the_new_resource(fleet: Fleet) -> None:
    pool = Pool(fleet, kind=201, lane_capacity=1)
    old = pool.register(KEY, 1)
    execution = pool.accept(pool.reserve(old))
    pool.unregister(old)
    new = pool.register(KEY, 1)
    new_execution = pool.accept(pool.reserve(new))
    execution.complete()
    assert pool.candidates(KEY)[0].active == 1
    new_execution.complete()
    assert pool.candidates(KEY)[0].active == 0
    pool.close()


def test_register_active_is_never_visible_as_idle(pool: Pool) -> None:
    rid, execution = pool.register_active(KEY, 1)
    [candidate] = pool.candidates(KEY)
    assert (candidate.active, candidate.free) == (0 + 1, 0)
    with pytest.raises(BusyError):
        pool.reserve(rid)
    assert execution.fence == 0
    execution.complete()
    assert pool.reserve(rid).fence == 1


def test_cancel_reservation_only_by_holder_and_only_once(
    shm_pool: Pool, agents: Callable[[], Agent]
) -> None:
    rid = shm_pool.register(KEY, 1)
    other = agents()
    lease = other.call("reserve", rid)
    with pytest.raises(NotOwnerError):
        shm_pool.cancel_reservation(lease)  # the owner is not the holder
    mine = shm_pool.register(KEY, 1)
    own_lease = shm_pool.reserve(mine)
    shm_pool.cancel_reservation(own_lease)
    with pytest.raises(NotReservedError):
        shm_pool.cancel_reservation(own_lease)
    with pytest.raises(NotReservedError):
        shm_pool.accept(own_lease)
    assert shm_pool.reserve(mine).fence == 2


@pytest.mark.parametrize("field", ["holder_node", "holder_incarnation"])
def test_cancel_by_a_holder_too_wide_to_print_is_refused_by_name(pool: Pool, field: str) -> None:
    lease = pool.reserve(pool.register(KEY, 1))
    wide: dict[str, Any] = {field: 1 << 20000}  # repr() of it raises
    forged = dataclasses.replace(lease, **wide)
    with pytest.raises(NotOwnerError, match="bits"):
        pool.cancel_reservation(forged)
    pool.cancel_reservation(lease)  # the real holder still can


def test_reconcile_ages_out_unreceived_reservations_by_owner_clock(pool: Pool) -> None:
    rid = pool.register(KEY, 2)
    lease = pool.reserve(rid)
    assert pool.reconcile(rid, 0, grace=60.0) == 0  # young: kept
    assert pool.candidates(KEY)[0].reserved == 1
    time.sleep(0.01)
    assert pool.reconcile(rid, 0, grace=0.0) == 1
    with pytest.raises(NotReservedError):
        pool.accept(lease)
    assert pool.candidates(KEY)[0].free == 2
    with pytest.raises(MalformedError):
        pool.reconcile(rid, 3, grace=1.0)  # active above capacity


def test_reconcile_sets_the_owners_active_count(pool: Pool) -> None:
    rid = pool.register(KEY, 4)
    pool.accept(pool.reserve(rid)).complete()
    executions = [pool.accept(pool.reserve(rid)) for _ in range(2)]
    assert pool.candidates(KEY)[0].active == 2
    pool.reconcile(rid, 1, grace=60.0)
    assert pool.candidates(KEY)[0].active == 1
    for execution in executions:
        execution.complete()
    assert pool.candidates(KEY)[0].active == 0  # never below zero


def test_reconcile_refuses_an_active_count_that_pending_reservations_would_overfill(
    pool: Pool,
) -> None:
    rid = pool.register(KEY, 1)
    lease = pool.reserve(rid)
    with pytest.raises(MalformedError, match="pending"):
        pool.reconcile(rid, 1, grace=60.0)  # 1 active + 1 pending > capacity 1
    (candidate,) = pool.candidates(KEY)
    assert (candidate.reserved, candidate.active) == (1, 0)  # nothing changed
    execution = pool.accept(lease)
    assert pool.candidates(KEY)[0].active == 1
    execution.complete()
    lease = pool.reserve(rid)
    time.sleep(0.01)
    assert pool.reconcile(rid, 1, grace=0.0) == 1  # aged out first: room for the count
    assert (pool.candidates(KEY)[0].reserved, pool.candidates(KEY)[0].active) == (0, 1)
    with pytest.raises(NotReservedError):
        pool.accept(lease)


def test_execution_context_manager_and_double_complete(pool: Pool) -> None:
    rid = pool.register(KEY, 1)
    with pool.accept(pool.reserve(rid)) as execution:
        assert pool.candidates(KEY)[0].active == 1
    assert execution.done
    execution.complete()
    assert pool.candidates(KEY)[0].active == 0


def test_dropped_execution_warns_and_gives_its_unit_back(pool: Pool) -> None:
    rid = pool.register(KEY, 1)
    execution = pool.accept(pool.reserve(rid))
    with pytest.warns(ResourceWarning, match="never completed"):
        del execution
    assert pool.candidates(KEY)[0].active == 0


def test_owner_only_operations_refuse_other_processes(
    shm_pool: Pool, agents: Callable[[], Agent]
) -> None:
    rid = rid_of(agents().call("register", KEY, 2))
    for call in (
        lambda: shm_pool.unregister(rid),
        lambda: shm_pool.drain(rid),
        lambda: shm_pool.reconcile(rid, 0, 1.0),
    ):
        with pytest.raises(NotOwnerError):
            call()


def test_bad_arguments_raise_malformed(pool: Pool, fleet: Fleet) -> None:
    rid = pool.register(KEY, 1)
    bad_calls: list[Callable[[], object]] = [
        lambda: pool.register(KEY, 0),
        lambda: pool.register(KEY, True),
        lambda: pool.register(5, 1),  # type: ignore[arg-type]
        lambda: pool.reserve("x"),  # type: ignore[arg-type]
        lambda: pool.accept(rid),  # type: ignore[arg-type]
        lambda: pool.claim_create(KEY, 0),
        lambda: pool.wait_capacity(KEY, -1),
        lambda: pool.wait_capacity(KEY, 0, timeout=float("nan")),
        lambda: pool.reconcile(rid, 0, grace=-1.0),
        lambda: Key(-1),
        lambda: Key(1 << 128),
        lambda: Key.from_bytes(b"short"),
    ]
    for call in bad_calls:
        with pytest.raises(MalformedError):
            call()
    assert issubclass(MalformedError, ValueError)


def test_reset_all_starts_a_larger_epoch_old_ids_stale_waiters_woken(pool: Pool) -> None:
    rid = pool.register(KEY, 2)
    lease = pool.reserve(rid)
    execution = pool.accept(pool.reserve(rid))
    permit = pool.claim_create(KEY, 5)
    before, since = pool.epoch, pool.version(KEY)
    woken: list[int | None] = []
    waiter = threading.Thread(target=lambda: woken.append(pool.wait_capacity(KEY, since, 10.0)))
    waiter.start()
    time.sleep(0.05)
    epoch = pool.reset_all()
    waiter.join(10.0)
    assert woken and woken[0] is not None
    assert epoch == pool.epoch > before
    assert pool.candidates(KEY) == [] and pool.budget(KEY) == (0, 0)
    for call in (lambda: pool.reserve(rid), lambda: pool.accept(lease)):
        with pytest.raises(StaleError):
            call()
    new = pool.register(KEY, 1)
    assert new.epoch == epoch != rid.epoch
    execution.complete()  # an old-epoch unit returns nothing to the new table
    permit.finish()
    assert pool.budget(KEY) == (1, 0)
    assert pool.candidates(KEY)[0].free == 1
