"""What ``orbit`` says when a fleet has no free node: one line that says what to do."""

from __future__ import annotations

import pytest

from orbitive import Fleet
from orbitive.cli import main
from orbitive.lock import LockTable

Capture = pytest.CaptureFixture[str]


def test_run_on_a_full_shm_store_says_how_to_make_room(fleet_name: str, capsys: Capture) -> None:
    with Fleet.join(fleet_name, 1):
        assert main(["run", "--lock", "job", "--store", f"shm://{fleet_name}", "--", "true"]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("orbit run: ")
    assert "all 1 nodes are held" in err and f"orbit clear {fleet_name} --all --yes" in err


def test_watch_of_a_full_fleet_says_how_to_make_room(fleet_name: str, capsys: Capture) -> None:
    with Fleet.join(fleet_name, 1) as fleet:
        table = LockTable(fleet)
        assert main(["watch", fleet_name, "--seconds", "0.1"]) == 1
        table.close()
    err = capsys.readouterr().err
    assert "all 1 nodes are held" in err and "stop every member" in err
