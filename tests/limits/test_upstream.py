"""``limits``' own storage and strategy tests, from its sdist, run on ``shm://``.

The sdist of the installed ``limits`` version comes from ``_sdist.limits_sdist``
(``ORBIT_LIMITS_SDIST``, or fetched once). Their in-memory cases of
``tests/test_storage.py``, ``tests/test_strategy.py`` and their ``tests/aio`` twins run
in a pytest of their own, with ``_upstream_plugin`` leading ``memory://`` to the SHM
storages (see it). Every case must pass but the two that ask a moving window for a
million entries, which a table refuses by design (``WindowTooLarge``: a moving
window holds at most 65536 timestamps).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import limits
import pytest

from .._fleets import remove_fleet_files
from ._sdist import limits_sdist

pytestmark = pytest.mark.serial  # their cases time windows of 1 and 2 s

HERE = Path(__file__).resolve().parent
FILES = ("tests/test_storage.py", "tests/test_strategy.py", "tests/aio/test_storage.py",
         "tests/aio/test_strategy.py")  # fmt: skip
#: Cases the table refuses by design: a moving-window limit of 1,000,000 (WindowTooLarge).
REFUSED_BY_DESIGN = {
    "tests.test_strategy.TestMovingWindow::test_moving_window_huge_cost[in-memory]",
    "tests.aio.test_strategy.TestAsyncMovingWindow::test_moving_window_huge_cost[in-memory]",
}


def test_limits_own_storage_and_strategy_tests_pass_on_shm(tmp_path: Path, fleet: str) -> None:
    root = limits_sdist()
    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\n")
    report = tmp_path / "report.xml"
    environment = dict(os.environ, ORBIT_UPSTREAM_URL=f"shm://{fleet}?capacity=256&window=64",
                       PYTHONPATH=str(HERE))  # fmt: skip
    environment.pop("PYTEST_XDIST_WORKER", None)
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "_upstream_plugin", "-c", str(ini),
         "--rootdir", str(root), "--noconftest", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-k", "in-memory", "-q", "-W", "ignore::pytest.PytestUnknownMarkWarning",
         f"--junitxml={report}", *FILES],
        cwd=root, env=environment, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    remove_fleet_files(fleet)
    assert report.exists(), ran.stdout[-3000:] + ran.stderr[-3000:]
    passed, failed = set(), set()
    for case in ElementTree.parse(report).iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            failed.add(name)
        elif case.find("skipped") is None:
            passed.add(name)
    print(f"limits {limits.__version__}'s own tests on shm://: {len(passed)} passed, "
          f"{len(failed)} failed ({len(REFUSED_BY_DESIGN & failed)} by design)")  # fmt: skip
    assert failed == REFUSED_BY_DESIGN, ran.stdout[-6000:]
    assert len(passed) >= 50
