"""``orbit locks | inspect | force-release`` on a store: every engine, and the default store."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbitive import Fleet
from orbitive.cli import main
from orbitive.lock import LockKey, LockTable
from orbitive.store import Store, open_store

from ..store.conftest import SHM_CAPACITY

Capture = pytest.CaptureFixture[str]


@pytest.fixture
def held(store_url: str) -> Iterator[Store]:
    """A store on each engine where "jobs/nightly" is held by "worker-1"."""
    with open_store(store_url) as store:
        assert store.try_lock("jobs/nightly", "worker-1", 60.0) is not None
        yield store


def test_locks_lists_the_store_locks_with_owner_token_and_time_left(
    held: Store, store_url: str, capsys: Capture
) -> None:
    assert main(["locks", "--store", store_url]) == 0
    lines = capsys.readouterr().out.splitlines()
    name, owner, token, left = lines[1].split()
    info = held.inspect("jobs/nightly")
    assert info is not None
    assert (name, owner, int(token)) == ("jobs/nightly", "worker-1", info.fencing_token)
    assert 0.0 < float(left) <= 60.0
    assert lines[-1].startswith("1 live lock(s) in ")


def test_locks_json_gives_each_lock_as_the_store_inspects_it(
    held: Store, store_url: str, capsys: Capture
) -> None:
    assert main(["locks", "--store", store_url, "--json"]) == 0
    parsed = json.loads(capsys.readouterr().out)
    info = held.inspect("jobs/nightly")
    assert info is not None
    assert parsed["store"] == held.url
    (lock,) = parsed["locks"]
    assert (lock["name"], lock["owner"]) == ("jobs/nightly", "worker-1")
    assert (lock["fencing_token"], lock["expires_at"]) == (info.fencing_token, info.expires_at)
    assert 0.0 < lock["remaining_s"] <= 60.0


def test_inspect_names_the_holder_and_exits_1_when_not_held(
    held: Store, store_url: str, capsys: Capture
) -> None:
    assert main(["inspect", "--store", store_url, "jobs/nightly"]) == 0
    assert "worker-1" in capsys.readouterr().out
    assert main(["inspect", "--store", store_url, "jobs/other"]) == 1
    assert capsys.readouterr().out.strip() == "not held"


def test_force_release_frees_the_lock_for_the_next_owner(
    held: Store, store_url: str, capsys: Capture
) -> None:
    assert main(["force-release", "--store", store_url, "jobs/nightly"]) == 0
    assert held.inspect("jobs/nightly") is None
    assert held.try_lock("jobs/nightly", "worker-2", 60.0) is not None
    assert main(["force-release", "--store", store_url, "jobs/absent"]) == 1
    assert capsys.readouterr().out.split() == ["released", "not", "held"]


def test_without_store_the_commands_use_open_stores_default(
    private_state_home: Path, capsys: Capture
) -> None:
    with open_store() as store:
        assert store.try_lock("stuck", "orbit-run:host:1", 1000.0) is not None
        assert main(["locks"]) == 0
        assert "stuck" in capsys.readouterr().out
        assert main(["force-release", "stuck"]) == 0
        assert store.inspect("stuck") is None
    assert (private_state_home / "orbitive" / "locks.db").exists()


def test_locks_of_a_fleet_shows_its_shm_store_locks_without_joining(
    shm_url: str, capsys: Capture
) -> None:
    fleet = shm_url.removeprefix("shm://").split("?")[0]
    with open_store(shm_url) as store:
        assert store.try_lock("jobs/nightly", "worker-1", 60.0) is not None
        assert main(["locks", fleet]) == 0
        out = capsys.readouterr().out
        assert "orbitive.store" in out and "jobs/nightly" in out and "worker-1" in out
        assert "\nshm:// store (kinds 230/231): 1 live of 256 slots" in out
        assert main(["force-release", fleet, "orbitive.store", "jobs/nightly"]) == 0
        assert store.inspect("jobs/nightly") is None


def test_locks_of_a_fleet_names_each_table_in_its_summary_line(
    shm_url: str, capsys: Capture
) -> None:
    fleet_name = shm_url.removeprefix("shm://").split("?")[0]
    with open_store(shm_url) as store, Fleet.join(fleet_name, SHM_CAPACITY) as fleet:
        table = LockTable(fleet)
        try:
            assert store.try_lock("jobs/nightly", "worker-1", 60.0) is not None
            assert table.try_acquire(LockKey("jobs", "a"), b"w-1", 60.0) is not None
            assert table.try_acquire(LockKey("jobs", "b"), b"w-2", 60.0) is not None
            assert main(["locks", fleet_name]) == 0
        finally:
            table.close()
    summaries = capsys.readouterr().out.splitlines()[-2:]
    assert summaries[0].startswith("LockTable (kinds 228/229): 2 live of ")
    assert summaries[1].startswith("shm:// store (kinds 230/231): 1 live of ")


@pytest.mark.parametrize(
    "argv",
    [
        ["locks", "web", "--store", "sqlite:x.db"],
        ["force-release", "web", "jobs"],
        ["force-release", "--store", "sqlite:x.db", "web", "jobs", "nightly"],
        ["force-release", "bad/fleet", "jobs", "nightly"],
    ],
    ids=["fleet-and-store", "two-names", "store-and-key", "bad-fleet"],
)
def test_contradictory_targets_are_usage_errors(argv: list[str], capsys: Capture) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"orbit {argv[0]}: ") and len(err.splitlines()) == 1


def test_watch_of_a_fleet_prints_its_shm_store_transitions(shm_url: str, capsys: Capture) -> None:
    fleet = shm_url.removeprefix("shm://").split("?")[0]
    with open_store(shm_url) as store:
        timer = threading.Timer(0.3, store.try_lock, ("jobs/watched", "late", 5.0))
        timer.start()
        assert main(["watch", fleet, "--seconds", "1.5"]) == 0
        timer.join()
    out = capsys.readouterr().out
    assert "acquired" in out and "orbitive.store/jobs/watched" in out and "owner=late" in out


def test_locks_shows_each_semaphore_with_its_holders(
    held: Store, store_url: str, capsys: Capture
) -> None:
    sem = held.semaphore("payments-api", 3)
    leases = [sem.try_acquire(owner, 60.0) for owner in ("worker-1", "worker-2")]
    assert all(lease is not None for lease in leases)
    assert leases[0] is not None and leases[0].release()
    assert main(["locks", "--store", store_url]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index("semaphore payments-api: 1 of 3 slot(s) held")
    assert lines[at + 1].split() == ["slot", "owner", "token", "left", "s"]
    slot, owner, token, left = lines[at + 2].split()
    assert leases[1] is not None
    assert (int(slot), owner, int(token)) == (1, "worker-2", leases[1].fencing_token)
    assert 0.0 < float(left) <= 60.0
    assert lines[at - 2].startswith("1 live lock(s) in ")  # the named lock, listed apart
    assert lines[-1].startswith("1 semaphore(s) with holders in ")


def test_locks_json_gives_each_semaphore_holder_beside_the_locks(
    held: Store, store_url: str, capsys: Capture
) -> None:
    lease = held.semaphore("payments-api", 3).try_acquire("worker-2", 60.0)
    assert lease is not None
    assert main(["locks", "--store", store_url, "--json"]) == 0
    parsed = json.loads(capsys.readouterr().out)
    assert [lock["name"] for lock in parsed["locks"]] == ["jobs/nightly"]
    (holder,) = parsed["semaphores"]
    assert (holder["name"], holder["slot"], holder["limit"], holder["owner"]) == (
        "payments-api",
        0,
        3,
        "worker-2",
    )
    assert (holder["fencing_token"], holder["expires_at"]) == (
        lease.fencing_token,
        lease.expires_at,
    )
    assert 0.0 < holder["remaining_s"] <= 60.0
