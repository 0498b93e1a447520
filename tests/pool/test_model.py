"""The pool table against a plain-Python model (hypothesis stateful testing).

Two members (two joined fleets in this process, nodes 0 and 1) share one tiny
table (4 keys, 4 resources per node), so key-full, lane-full, busy, draining,
stale and not-owner paths are all reachable in a few steps.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
)

from orbitive import Fleet
from orbitive._core._errors import (
    BusyError,
    CreationBudgetError,
    DrainingError,
    FleetError,
    KeyFullError,
    LaneFullError,
    NotOwnerError,
    NotReservedError,
    OrbitError,
    StaleError,
)
from orbitive.pool import CreationPermit, Execution, Key, Lease, Pool, ResourceId

from .._fleets import new_fleet_name, remove_fleet_files

KEYS = [Key(value) for value in (1, 2, 3, 4, 5, 6)]
KEY_CAPACITY = 4
LANE = 4
KIND = 250
PENDING = 16


@dataclass
class ModelResource:
    owner: int
    key: Key
    capacity: int
    state: str = "live"  # live | draining | closed
    pending: set[int] = field(default_factory=set)
    active: int = 0
    fence: int = 0


@dataclass
class Model:
    keys: set[Key] = field(default_factory=set)
    resources: dict[ResourceId, ModelResource] = field(default_factory=dict)
    claims: dict[tuple[int, Key], int] = field(default_factory=dict)

    def install(self, key: Key) -> None:
        if key not in self.keys and len(self.keys) >= KEY_CAPACITY:
            raise KeyFullError("model: key table full")
        self.keys.add(key)

    def live(self, key: Key) -> int:
        return sum(1 for r in self.resources.values() if r.key == key and r.state != "closed")

    def creating(self, key: Key) -> int:
        return sum(count for (_, k), count in self.claims.items() if k == key)


def expect(error: type[OrbitError] | None, call: object) -> object:
    """Run ``call`` and check that it raises exactly ``error`` (or nothing)."""
    assert callable(call)
    if error is None:
        return call()
    with pytest.raises(error):
        call()
    return None


class PoolMachine(RuleBasedStateMachine):
    """Random operations on the real table and the model, compared after each step."""

    resources = Bundle("resources")
    leases = Bundle("leases")
    executions = Bundle("executions")
    permits = Bundle("permits")

    @initialize()
    def open_members(self) -> None:
        self.name = new_fleet_name()
        self.fleets = [Fleet.join(self.name, 2), Fleet.join(self.name, 2)]
        self.pools = [self._open(f) for f in self.fleets]
        assert [p.node for p in self.pools] == [0, 1]
        self.model = Model()
        self.lives = [0, 0]
        self.accepted: list[Execution] = []

    @staticmethod
    def _open(fleet: Fleet) -> Pool:
        return Pool(fleet, kind=KIND, key_capacity=KEY_CAPACITY, lane_capacity=LANE)

    def teardown(self) -> None:
        for execution in getattr(self, "accepted", []):
            with contextlib.suppress(FleetError):  # a dead life's mapping is gone
                execution.complete()
        for pool in getattr(self, "pools", []):
            pool.close()
        for fleet in getattr(self, "fleets", []):
            fleet.close()
        if hasattr(self, "name"):
            remove_fleet_files(self.name)

    # -- resources ---------------------------------------------------------------------

    @rule(target=resources, member=st.integers(0, 1), key=st.sampled_from(KEYS),
          capacity=st.integers(1, 3))  # fmt: skip
    def register(self, member: int, key: Key, capacity: int) -> object:
        model = self.model
        error: type[OrbitError] | None = None
        try:
            model.install(key)
        except KeyFullError:
            error = KeyFullError
        used = sum(1 for r in model.resources.values() if r.owner == member and r.state != "closed")
        if error is None and used >= LANE:
            error = LaneFullError
        rid = expect(error, lambda: self.pools[member].register(key, capacity))
        if rid is None:
            return multiple()
        assert isinstance(rid, ResourceId) and rid not in model.resources
        model.resources[rid] = ModelResource(member, key, capacity)
        return rid

    def _owner_error(self, member: int, rid: ResourceId) -> type[OrbitError] | None:
        resource = self.model.resources[rid]
        if resource.owner != member:
            return NotOwnerError
        return StaleError if resource.state == "closed" else None

    @rule(rid=resources, member=st.integers(0, 1))
    def unregister(self, rid: ResourceId, member: int) -> None:
        error = self._owner_error(member, rid)
        expect(error, lambda: self.pools[member].unregister(rid))
        if error is None:
            self.model.resources[rid].state = "closed"

    @rule(rid=resources, member=st.integers(0, 1))
    def drain(self, rid: ResourceId, member: int) -> None:
        error = self._owner_error(member, rid)
        expect(error, lambda: self.pools[member].drain(rid))
        if error is None:
            self.model.resources[rid].state = "draining"

    # -- leases ------------------------------------------------------------------------

    @rule(target=leases, rid=resources, member=st.integers(0, 1))
    def reserve(self, rid: ResourceId, member: int) -> object:
        resource = self.model.resources[rid]
        error: type[OrbitError] | None = None
        if resource.state == "closed":
            error = StaleError
        elif resource.state == "draining":
            error = DrainingError
        elif len(resource.pending) + resource.active >= resource.capacity:
            error = BusyError
        lease = expect(error, lambda: self.pools[member].reserve(rid))
        if lease is None:
            return multiple()
        assert isinstance(lease, Lease)
        resource.fence += 1
        assert lease.fence == resource.fence
        assert lease.holder_node == member
        resource.pending.add(lease.fence)
        return lease

    @rule(target=executions, lease=leases, member=st.integers(0, 1))
    def accept(self, lease: Lease, member: int) -> object:
        resource = self.model.resources[lease.id]
        error = self._owner_error(member, lease.id)
        if error is None and resource.state == "draining":
            error = DrainingError
        if error is None and lease.fence not in resource.pending:
            error = NotReservedError
        execution = expect(error, lambda: self.pools[member].accept(lease))
        if execution is None:
            return multiple()
        resource.pending.discard(lease.fence)
        resource.active += 1
        assert isinstance(execution, Execution)
        self.accepted.append(execution)
        return (execution, lease.id, member, self.lives[member])

    @rule(item=consumes(executions))
    def complete(self, item: tuple[Execution, ResourceId, int, int]) -> None:
        execution, rid, member, life = item
        if life != self.lives[member]:
            expect(FleetError, execution.complete)  # that process life is over
            return
        execution.complete()
        resource = self.model.resources[rid]
        if resource.state != "closed":
            resource.active -= 1

    @rule(lease=leases, member=st.integers(0, 1))
    def cancel(self, lease: Lease, member: int) -> None:
        resource = self.model.resources[lease.id]
        error: type[OrbitError] | None = None
        holder = (lease.holder_node, lease.holder_incarnation)
        if holder != (member, self.pools[member].incarnation):
            error = NotOwnerError
        elif resource.state == "closed":
            error = StaleError
        elif lease.fence not in resource.pending:
            error = NotReservedError
        expect(error, lambda: self.pools[member].cancel_reservation(lease))
        if error is None:
            resource.pending.discard(lease.fence)

    # -- claims and deaths -------------------------------------------------------------

    @rule(target=permits, member=st.integers(0, 1), key=st.sampled_from(KEYS),
          max_live=st.integers(1, 3))  # fmt: skip
    def claim(self, member: int, key: Key, max_live: int) -> object:
        model = self.model
        error: type[OrbitError] | None = None
        try:
            model.install(key)
        except KeyFullError:
            error = KeyFullError
        if error is None and model.live(key) + model.creating(key) >= max_live:
            error = CreationBudgetError
        permit = expect(error, lambda: self.pools[member].claim_create(key, max_live))
        if permit is None:
            return multiple()
        model.claims[(member, key)] = model.claims.get((member, key), 0) + 1
        return (permit, member, key, self.lives[member])

    @rule(item=consumes(permits))
    def finish(self, item: tuple[CreationPermit, int, Key, int]) -> None:
        permit, member, key, life = item
        if life != self.lives[member]:
            expect(FleetError, permit.finish)  # its claims went with the death report
            return
        permit.finish()
        count = self.model.claims.get((member, key), 0)
        if count:
            self.model.claims[(member, key)] = count - 1

    @rule(target=resources, reporter=st.integers(0, 1))
    def second_member_dies_and_returns(self, reporter: int) -> object:
        """Node 1 is reported dead (its resources and claims go), then comes back."""
        dead = self.pools[1]
        closed = self.pools[reporter].node_dead(1, dead.incarnation)
        expected = [
            r for r in self.model.resources.values() if r.owner == 1 and r.state != "closed"
        ]
        assert closed == len(expected)
        for resource in expected:
            resource.state = "closed"
        for member, key in list(self.model.claims):
            if member == 1:
                self.model.claims[(member, key)] = 0
        dead.close()
        self.fleets[1].close()
        self.fleets[1] = Fleet.join(self.name, 2, node=1)  # a new life on the same node
        self.lives[1] += 1
        self.pools[1] = Pool(
            self.fleets[1], kind=KIND, key_capacity=KEY_CAPACITY, lane_capacity=LANE
        )
        return multiple()

    # -- comparison --------------------------------------------------------------------

    @invariant()
    def table_matches_model(self) -> None:
        if not hasattr(self, "model"):
            return
        statistics = self.pools[0].statistics()
        assert {k.key for k in statistics.keys} == self.model.keys
        for key_row in statistics.keys:
            assert key_row.live == self.model.live(key_row.key)
            assert key_row.creating == self.model.creating(key_row.key)
        seen = {r.id: r for r in statistics.resources}
        expected = {rid: r for rid, r in self.model.resources.items() if r.state != "closed"}
        assert set(seen) == set(expected)
        for rid, resource in expected.items():
            row = seen[rid]
            assert row.owner_node == resource.owner
            assert row.state == resource.state
            assert (row.capacity, row.reserved, row.active) == (
                resource.capacity, len(resource.pending), resource.active,
            )  # fmt: skip
            assert row.fence == resource.fence


TestPoolModel = PoolMachine.TestCase
TestPoolModel.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
