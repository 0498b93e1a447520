"""The suite's own check (tests/conftest.py): a run that passes but leaves an SHM object
behind fails, naming it; a run that leaves nothing passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ._fleets import fleet_files

ROOT = Path(__file__).resolve().parents[1]
LEAVES_A_FLEET = """
import os
from orbitive import Fleet

def test_joins_and_never_closes():
    Fleet.join(os.environ["ORBIT_TEST_LEAK_FLEET"], 2)
"""
LEAVES_NOTHING = """
import os
from orbitive import Fleet
from tests._fleets import remove_fleet_files

def test_joins_closes_and_removes():
    name = os.environ["ORBIT_TEST_LEAK_FLEET"]
    Fleet.join(name, 2).close()
    remove_fleet_files(name)
"""


def run_with_the_suites_check(
    tmp_path: Path, test: str, fleet: str
) -> subprocess.CompletedProcess[str]:
    """Run ``test`` (a module's text) under pytest with tests/conftest.py as a plugin."""
    (tmp_path / "test_inner.py").write_text(test)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
         "-p", "no:xdist", "-q", str(tmp_path / "test_inner.py")],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "ORBIT_TEST_LEAK_FLEET": fleet},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip


def test_a_passing_run_that_leaves_an_shm_object_fails_and_names_it(
    tmp_path: Path, fleet_name: str
) -> None:
    done = run_with_the_suites_check(tmp_path, LEAVES_A_FLEET, fleet_name)
    left = fleet_files(fleet_name)
    assert left, "the inner test left nothing: the check was not tried"
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert "SHM object(s) in /dev/shm" in done.stdout
    assert all(path.name in done.stdout for path in left), done.stdout


def test_a_run_that_leaves_nothing_passes(tmp_path: Path, fleet_name: str) -> None:
    done = run_with_the_suites_check(tmp_path, LEAVES_NOTHING, fleet_name)
    assert done.returncode == pytest.ExitCode.OK, done.stdout + done.stderr
    assert not fleet_files(fleet_name)
