"""Pool.unlink: the name goes, mappings keep working, the next Pool starts a fresh table."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from orbitive import Fleet
from orbitive._core._errors import StaleError
from orbitive._core._region import object_name, object_size
from orbitive.pool import POOL_KIND, Key, Pool

from ._agent import Agent

KEY = Key(0xC0FFEE)


def test_unlink_removes_the_name_handles_keep_working_a_new_pool_is_fresh(
    shm_fleet: Fleet, fleet_name: str, agents: Callable[..., Agent]
) -> None:
    name = object_name(fleet_name, POOL_KIND)
    pool = Pool(shm_fleet)
    member = agents()  # maps the table before the unlink
    rid = pool.register(KEY, 3)
    held = member.call("reserve", rid)
    old_epoch = pool.epoch
    size = object_size(name)
    assert size is not None
    pool.unlink()
    assert object_size(name) is None

    # Both processes keep using the table they mapped.
    with pool.accept(held):
        lease = member.call("reserve", rid)
        assert lease.fence == 2
        [candidate] = member.call("candidates", KEY)
        assert (candidate.id, candidate.reserved, candidate.active) == (rid, 1, 1)
    handle = member.call("register_active", KEY, 1)[1]
    member.call("complete", handle)
    assert len(pool.candidates(KEY)) == 2  # the member's registration, seen through ours
    assert object_size(name) is None  # using the old table brought no name back

    # A new Pool (this process, or a process that joins now) creates a new table.
    with Pool(shm_fleet) as fresh:
        assert object_size(name) == size
        assert fresh.epoch != old_epoch
        assert fresh.candidates(KEY) == []
        for call in (lambda: fresh.reserve(rid), lambda: fresh.accept(lease)):
            with pytest.raises(StaleError):
                call()
        newcomer = agents()
        assert newcomer.call("candidates", KEY) == []
        with pytest.raises(StaleError):
            newcomer.call("reserve", rid)
        new = fresh.register(KEY, 1)
        assert new.epoch == fresh.epoch
        assert newcomer.call("reserve", new).fence == 1
    assert [c.id for c in pool.candidates(KEY)].count(rid) == 1  # the old table is unchanged
    pool.accept(lease).complete()
    pool.close()


def test_unlink_of_a_local_fleets_pool_starts_a_larger_epoch(fleet_name: str) -> None:
    with Fleet.local(fleet_name, 4) as fleet, Pool(fleet) as pool:
        rid = pool.register(KEY, 1)
        lease = pool.reserve(rid)
        before = pool.epoch
        pool.unlink()  # nothing to unlink: the table is emptied into a new epoch
        assert pool.epoch > before
        assert pool.candidates(KEY) == []
        for call in (lambda: pool.reserve(rid), lambda: pool.accept(lease)):
            with pytest.raises(StaleError):
                call()
        assert pool.register(KEY, 1).epoch == pool.epoch
