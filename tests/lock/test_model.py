"""LockTable against a plain-Python model, driven by hypothesis (stateful).

The model keeps, per key, the live tenure (owner, lock id, deadline in
milliseconds of the host monotonic clock) and the table's two counters. Expiry
uses the real clock: each operation is bracketed by clock reads, an entry is
live when its deadline is after the later read, gone when it is not after the
earlier one, and only in between may the table decide either way (the model
then follows the table). Small ttls plus a ``wait`` rule make expiry happen.
Every rule that feeds the lease bundle adds exactly one lease whatever the
clock did, so hypothesis can replay an example draw for draw.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from orbitive import Fleet
from orbitive.lock import Acquired, LockKey, LockLease, LockOwner, LockTable, Occupied

from .._fleets import new_fleet_name, remove_fleet_files

KEYS = [LockKey("tests.model", "a"), LockKey("tests.model", "b"), LockKey(b"other", b"a")]
OWNERS = [LockOwner(b"alice"), LockOwner(b"bob")]
TTLS = [0.002, 0.015, 60.0]
_T = TypeVar("_T")


def now_ms() -> int:
    """The table's clock: CLOCK_MONOTONIC in whole milliseconds."""
    return time.monotonic_ns() // 1_000_000


def ms(seconds: float) -> int:
    return round(seconds * 1000)


class Life(Enum):
    LIVE = "live"
    GONE = "gone"
    EITHER = "either"


@dataclass
class Entry:
    owner: LockOwner
    lock_id: int
    token: int
    expires_ms: int


class LockTableModel(RuleBasedStateMachine):
    """Rules call one table method each and compare it with the model."""

    shared = False
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.name = new_fleet_name()
        self.fleet = Fleet.join(self.name, 1) if self.shared else Fleet.local(self.name, 1)
        self.table = LockTable(self.fleet)
        self.entries: dict[LockKey, Entry] = {}
        self.token = 0
        self.revision = 0
        self.window = (0, 0)

    def teardown(self) -> None:
        self.table.close()
        self.table.unlink()
        self.fleet.close()
        remove_fleet_files(self.name)

    # -- helpers ------------------------------------------------------------------------

    def timed(self, call: Callable[[], _T]) -> _T:
        before = now_ms()
        result = call()
        self.window = (before, now_ms())
        return result

    def life(self, key: LockKey) -> Life:
        entry = self.entries.get(key)
        if entry is None or entry.expires_ms <= self.window[0]:
            return Life.GONE
        return Life.LIVE if entry.expires_ms > self.window[1] else Life.EITHER

    def check_outcome(self, key: LockKey, succeeded: bool, applies: bool) -> None:
        """``applies``: the request matches the model's entry (if that entry is live)."""
        life = self.life(key) if applies else Life.GONE
        if succeeded:
            assert applies
            assert life is not Life.GONE, (key, self.entries.get(key), self.window)
        else:
            assert life is not Life.LIVE or not applies, (key, self.entries.get(key))
            if applies:
                del self.entries[key]  # it expired during the call

    def check_mutation(self, lease: LockLease, token: int, ttl_ms: int | None) -> None:
        self.revision += 1
        assert lease.state_revision == self.revision
        assert lease.fencing_token == token
        if ttl_ms is not None:
            deadline = ms(lease.expires_at)
            assert self.window[0] + ttl_ms <= deadline <= self.window[1] + ttl_ms

    # -- rules --------------------------------------------------------------------------

    @initialize()
    def start_empty(self) -> None:
        assert self.table.leases() == []

    @rule(target=leases, key=st.sampled_from(KEYS), owner=st.sampled_from(OWNERS),
          ttl=st.sampled_from(TTLS))  # fmt: skip
    def acquire(self, key: LockKey, owner: LockOwner, ttl: float) -> LockLease:
        result = self.timed(lambda: self.table.try_acquire(key, owner, ttl))
        entry = self.entries.get(key)
        if isinstance(result, Occupied):
            assert entry is not None and self.life(key) is not Life.GONE
            assert result.lease.lock_id == entry.lock_id
            assert result.lease.owner == entry.owner
            return result.lease  # the holder's lease: every rule adds one, timing or not
        assert isinstance(result, Acquired)
        assert self.life(key) is not Life.LIVE
        self.token += 1
        self.check_mutation(result.lease, self.token, ms(ttl))
        assert (result.lease.key, result.lease.owner) == (key, owner)
        lease = result.lease
        self.entries[key] = Entry(owner, lease.lock_id, self.token, ms(lease.expires_at))
        return result.lease

    @rule(target=leases, lease=leases, ttl=st.sampled_from(TTLS))
    def renew(self, lease: LockLease, ttl: float) -> LockLease:
        entry = self.entries.get(lease.key)
        applies = entry is not None and entry.lock_id == lease.lock_id
        renewed = self.timed(lambda: self.table.renew(lease, ttl))
        self.check_outcome(lease.key, renewed is not None, applies)
        if renewed is None:
            return lease  # keep the bundle's size independent of the clock
        assert entry is not None
        self.check_mutation(renewed, lease.fencing_token, ms(ttl))
        entry.expires_ms = ms(renewed.expires_at)
        return renewed

    @rule(key=st.sampled_from(KEYS), owner=st.sampled_from(OWNERS), ttl=st.sampled_from(TTLS))
    def renew_owned(self, key: LockKey, owner: LockOwner, ttl: float) -> None:
        entry = self.entries.get(key)
        applies = entry is not None and entry.owner == owner
        renewed = self.timed(lambda: self.table.renew_owned(key, owner, ttl))
        self.check_outcome(key, renewed is not None, applies)
        if renewed is not None:
            assert entry is not None and renewed.lock_id == entry.lock_id
            self.check_mutation(renewed, entry.token, ms(ttl))
            entry.expires_ms = ms(renewed.expires_at)

    @rule(lease=leases)
    def release(self, lease: LockLease) -> None:
        entry = self.entries.get(lease.key)
        applies = entry is not None and entry.lock_id == lease.lock_id
        released = self.timed(lambda: self.table.release(lease))
        self.released(lease.key, released, applies)

    @rule(key=st.sampled_from(KEYS), owner=st.sampled_from(OWNERS))
    def release_owned(self, key: LockKey, owner: LockOwner) -> None:
        entry = self.entries.get(key)
        applies = entry is not None and entry.owner == owner
        self.released(key, self.timed(lambda: self.table.release_owned(key, owner)), applies)

    @rule(key=st.sampled_from(KEYS))
    def force_release(self, key: LockKey) -> None:
        applies = key in self.entries
        self.released(key, self.timed(lambda: self.table.force_release(key)), applies)

    def released(self, key: LockKey, released: bool, applies: bool) -> None:
        self.check_outcome(key, released, applies)
        if released:
            del self.entries[key]
            self.revision += 1

    @rule(key=st.sampled_from(KEYS), owner=st.sampled_from(OWNERS))
    def lookup(self, key: LockKey, owner: LockOwner) -> None:
        found = self.timed(lambda: self.table.current(key))
        applies = key in self.entries
        self.check_outcome(key, found is not None, applies)
        if found is not None:
            assert found.lock_id == self.entries[key].lock_id
            restored = self.table.restore(key, owner)
            if found.owner != owner:
                assert restored is None
            elif restored is not None:  # None only if it expired since the lookup
                assert restored.lock_id == found.lock_id

    @rule()
    def list_leases(self) -> None:
        found = self.timed(self.table.leases)
        by_key = {lease.key: lease for lease in found}
        assert len(by_key) == len(found), "two entries for one key"
        for key in KEYS:
            self.check_outcome(key, key in by_key, key in self.entries)
            if key in by_key:
                assert by_key[key].lock_id == self.entries[key].lock_id

    @rule(seconds=st.sampled_from([0.003, 0.02]))
    def wait(self, seconds: float) -> None:
        time.sleep(seconds)

    @invariant()
    def counters_match(self) -> None:
        statistics = self.table.statistics()
        assert statistics.last_fencing_token == self.token
        assert statistics.last_state_revision == self.revision

    @invariant()
    def every_entry_lies_within_the_probe_bound(self) -> None:
        bound = self.table.statistics().max_probe
        mask = self.table.layout.capacity - 1
        assert bound <= mask
        for lease in self.table.leases():
            assert (lease.slot - lease.key.digest) & mask <= bound, (lease, bound)


class SharedLockTableModel(LockTableModel):
    """The same model over a joined (SHM) fleet."""

    shared = True


MODEL_SETTINGS = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLockTableOnLocalFleet = LockTableModel.TestCase
TestLockTableOnLocalFleet.settings = MODEL_SETTINGS
TestLockTableOnSharedFleet = SharedLockTableModel.TestCase
TestLockTableOnSharedFleet.settings = MODEL_SETTINGS
