"""``orbit list | clear | locks | watch | force-release``: output, exit codes, refusals."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from orbitive import Fleet
from orbitive._core._region import SHM_DIR, client_socket_name
from orbitive.cli import main
from orbitive.lock import LockKey, LockTable, Occupied

from .._fleets import fleet_files, shm_path

Capture = pytest.CaptureFixture[str]


@pytest.fixture
def held(fleet_name: str) -> Iterator[LockTable]:
    """A member process (this one) holding two leases, one with unprintable bytes."""
    with Fleet.join(fleet_name, 4) as fleet:
        table = LockTable(fleet)
        table.try_acquire(LockKey("jobs", "nightly"), b"worker-1", 60.0)
        table.try_acquire(LockKey("jobs", "evil\n\x1b[31mred"), b"\xff\x00", 60.0)
        yield table
        table.close()
        table.unlink()


def test_list_shows_the_lock_objects_and_their_kinds(held: LockTable, capsys: Capture) -> None:
    assert main(["list", held.fleet.name]) == 0
    out = capsys.readouterr().out
    assert "228" in out and "lock state table" in out
    assert "229" in out and "lock transition ring" in out


def test_list_shows_the_membership_object_with_its_capacity_and_the_nodes_held(
    held: LockTable, capsys: Capture
) -> None:
    name = held.fleet.name
    assert main(["list", name]) == 0
    last = capsys.readouterr().out.splitlines()[-1].split()
    assert last[0] == "members" and last[3] == f"orbit-{name}-members-{os.geteuid()}"
    assert last[4:] == ["membership", "object:", "capacity", "4,", "nodes", "held:", "0"]
    assert main(["list", name, "--kind", "228"]) == 0  # a kind's objects only
    assert "members" not in capsys.readouterr().out


def test_list_of_a_fleet_with_only_its_membership_object_shows_it_and_clear_removes_it(
    fleet_name: str, capsys: Capture
) -> None:
    Fleet.join(fleet_name, 3).close()  # a member that opened no table
    assert [path.name for path in fleet_files(fleet_name)] == [
        f"orbit-{fleet_name}-members-{os.geteuid()}"
    ]
    assert main(["list", fleet_name]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "capacity 3, nodes held: none" in out
    assert main(["list"]) == 0
    assert f"{fleet_name}  kinds members  " in capsys.readouterr().out
    assert main(["clear", fleet_name, "--all", "--yes"]) == 0
    assert "removed 1 object(s)" in capsys.readouterr().out


def test_list_shows_every_name_clear_removes(fleet_name: str, capsys: Capture) -> None:
    with Fleet.join(fleet_name, 4) as fleet:
        LockTable(fleet).close()
    with socket.socket(socket.AF_UNIX) as left:  # a remote-mode owner's socket, left behind
        left.bind(str(SHM_DIR / client_socket_name(fleet_name, 247, 1, "0123456789ab")))
    assert main(["list", fleet_name]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "client pool socket of node 1" in lines[2]
    listed = [line.split()[3] for line in lines]
    assert sorted(listed) == sorted(path.name for path in fleet_files(fleet_name))
    assert main(["clear", fleet_name, "--all", "--yes"]) == 0
    assert f"removed {len(listed)} object(s)" in capsys.readouterr().out
    assert fleet_files(fleet_name) == []


def test_list_without_a_fleet_names_every_fleet_with_its_kinds(
    held: LockTable, capsys: Capture
) -> None:
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"{held.fleet.name}  kinds 228, 229, members  ") for line in lines)


def test_list_of_an_unknown_fleet_exits_1(fleet_name: str, capsys: Capture) -> None:
    assert main(["list", fleet_name]) == 1
    assert "has no SHM objects" in capsys.readouterr().err


def test_locks_prints_owner_token_and_escapes_control_bytes(
    held: LockTable, capsys: Capture
) -> None:
    assert main(["locks", held.fleet.name]) == 0
    out = capsys.readouterr().out
    assert "worker-1" in out and "nightly" in out
    assert "ff00" in out  # unprintable owner bytes as hex
    assert "\x1b" not in out and "evil\\n\\x1b[31mred" in out
    assert len(out.splitlines()) == 4  # header, two leases, summary: no split rows
    assert "2 live of 256 slots" in out


def test_locks_json_gives_the_leases_and_the_tables_counters(
    held: LockTable, capsys: Capture
) -> None:
    assert isinstance(held.try_acquire(LockKey("jobs", "nightly"), b"worker-2", 1.0), Occupied)
    assert main(["locks", held.fleet.name, "--json"]) == 0
    parsed = json.loads(capsys.readouterr().out)
    assert parsed["fleet"] == held.fleet.name
    (table,) = parsed["tables"]
    assert (table["state_kind"], table["event_kind"], table["capacity"]) == (228, 229, 256)
    assert (table["live"], table["acquisitions"], table["conflicts"]) == (2, 2, 1)
    assert table["recoveries"] == 0
    leases = {lease["label"]: lease for lease in table["leases"]}
    assert leases["nightly"]["owner"] == "worker-1"
    assert leases["nightly"]["namespace"] == "jobs"
    assert leases["nightly"]["fencing_token"] == 1 and 0 < leases["nightly"]["remaining_s"] <= 60
    assert leases["evil\\n\\x1b[31mred"]["owner"] == "ff00"  # escaped as in the table


def test_list_json_names_each_object_of_the_fleet(held: LockTable, capsys: Capture) -> None:
    assert main(["list", held.fleet.name, "--json"]) == 0
    (fleet,) = json.loads(capsys.readouterr().out)["fleets"]
    assert fleet["fleet"] == held.fleet.name
    holds = {item["kind"]: item["holds"] for item in fleet["objects"]}
    assert holds == {
        228: "lock state table",
        229: "lock transition ring",
        "members": f"membership object: capacity 4, nodes held: {held.fleet.node}",
    }
    assert all(item["bytes"] > 0 for item in fleet["objects"])
    assert main(["list", "--json"]) == 0
    listing = {item["fleet"]: item for item in json.loads(capsys.readouterr().out)["fleets"]}
    names = [item["name"] for item in listing[held.fleet.name]["objects"]]
    assert names == [item["name"] for item in fleet["objects"]]
    assert main(["list", held.fleet.name + "-none", "--json"]) == 1
    assert json.loads(capsys.readouterr().out) == {"fleets": []}


def test_force_release_releases_once_then_exits_1(held: LockTable, capsys: Capture) -> None:
    assert main(["force-release", held.fleet.name, "jobs", "nightly"]) == 0
    assert held.current(LockKey("jobs", "nightly")) is None
    assert main(["force-release", held.fleet.name, "jobs", "nightly"]) == 1
    assert capsys.readouterr().out.split() == ["released", "not", "held"]


def test_watch_prints_a_transition_made_while_it_runs(held: LockTable, capsys: Capture) -> None:
    key = LockKey("jobs", "watched")
    timer = threading.Timer(0.3, held.try_acquire, (key, b"late", 5.0))
    timer.start()
    assert main(["watch", held.fleet.name, "--seconds", "1.5"]) == 0
    timer.join()
    out = capsys.readouterr().out
    assert "acquired" in out and "jobs/watched" in out and "owner=late" in out


def test_clear_refuses_while_a_member_lives(held: LockTable, capsys: Capture) -> None:
    assert main(["clear", held.fleet.name, "--all", "--yes"]) == 1
    assert "live member" in capsys.readouterr().err
    assert shm_path(held.fleet.name, 228).exists()


def test_clear_all_needs_yes_and_then_removes_every_file(fleet_name: str, capsys: Capture) -> None:
    with Fleet.join(fleet_name, 2) as fleet:
        LockTable(fleet).close()
    assert main(["clear", fleet_name, "--all"]) == 2
    files = fleet_files(fleet_name)
    assert len(files) == 3  # the lock table, its transition ring and the membership object
    assert main(["clear", fleet_name, "--all", "--yes"]) == 0
    assert f"removed {len(files)} object(s)" in capsys.readouterr().out
    assert fleet_files(fleet_name) == []


def test_clear_one_kind_leaves_the_others(fleet_name: str) -> None:
    with Fleet.join(fleet_name, 2) as fleet:
        LockTable(fleet).close()
    assert main(["clear", fleet_name, "--kind", "229"]) == 0
    assert shm_path(fleet_name, 228).exists() and not shm_path(fleet_name, 229).exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["list", "bad/name"],
        ["locks", "x" * 33],
        ["list", "ok", "--kind", "999"],
        ["clear", "ok", "--kind", "lock"],
        ["force-release"],
        ["watch", "ok", "--seconds", "soon"],
    ],
    ids=["slash", "too-long", "kind-range", "kind-word", "missing-args", "seconds-word"],
)
def test_bad_arguments_exit_2_with_a_message(argv: list[str], capsys: Capture) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "usage: orbit" in err and "Traceback" not in err


def test_every_command_has_help() -> None:
    commands = (
        "list",
        "clear",
        "locks",
        "watch",
        "force-release",
        "inspect",
        "run",
        "pool",
        "budget",
        "demo",
    )
    for command in commands:
        result = subprocess.run(
            [sys.executable, "-m", "orbitive.cli", command, "--help"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert result.returncode == 0, command
        assert f"usage: orbit {command}" in result.stdout.replace("__main__.py", "orbit")


def test_locks_of_a_fleet_without_a_lock_table_exits_1(fleet_name: str, capsys: Capture) -> None:
    started = time.monotonic()
    assert main(["locks", fleet_name]) == 1
    assert "has no lock table" in capsys.readouterr().err
    assert time.monotonic() - started < 30
