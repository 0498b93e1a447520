"""``orbit pool`` shows a client pool's key as PgBouncer's SHOW POOLS does, dead owners apart."""

from __future__ import annotations

import signal

import pytest

from orbitive.cli import main

from .._children import lock_table_member
from .._processes import Processes
from ._workers import fake_holder
from .conftest import CAPACITY


def _key_row(out: str) -> list[str]:
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.strip().startswith("KEY"))
    return lines[header + 1].split()


def test_orbit_pool_counts_live_idle_in_use_and_then_the_dead_owner(
    spawned: Processes, fleet_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    holder = spawned.start(fake_holder, fleet_name, CAPACITY, 2, 1)
    assert holder.recv(60) == 2
    assert main(["pool", fleet_name]) == 0
    out = capsys.readouterr().out
    assert "LIVE  IDLE  IN USE  WAITING  CREATING  DEAD" in out
    # KEY, LIVE, IDLE, IN USE, WAITING, CREATING, DEAD
    assert _key_row(out)[1:7] == ["3", "1", "2", "0", "0", "0"]
    assert holder.kill() == -signal.SIGKILL
    assert main(["pool", fleet_name]) == 0
    assert _key_row(capsys.readouterr().out)[1:7] == ["0", "0", "0", "0", "0", "3"]


def test_orbit_pool_counts_a_dead_owner_whose_node_a_process_without_a_pool_took(
    spawned: Processes, fleet_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    holder = spawned.start(fake_holder, fleet_name, CAPACITY, 2, 1)
    assert holder.recv(60) == 2
    assert holder.kill() == -signal.SIGKILL
    member = spawned.start(lock_table_member, fleet_name, CAPACITY)
    node, _ = member.recv(60)  # the dead owner's node, held by a process with no pool
    assert main(["pool", fleet_name]) == 0
    out = capsys.readouterr().out
    assert _key_row(out)[1:7] == ["0", "0", "0", "0", "0", "3"]
    assert f"node {node} (incarnation" in out and "alive" not in out  # members and owners
