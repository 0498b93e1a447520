"""``limits``' own storage and strategy tests, run on ``postgresql://``.

The sdist of the installed ``limits`` comes from ``_sdist.limits_sdist``
(``ORBIT_LIMITS_SDIST``, or fetched once): the test runs pytest over its
``tests/test_strategy.py``, ``tests/test_storage.py`` and their ``tests/aio/`` twins,
keeping the in-memory cases (``-k in-memory``), whose
``memory://`` and ``async+memory://`` the plugin ``_pg_upstream_plugin`` turns into
this suite's PostgreSQL storages on a fresh schema.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from .._servers import TempPostgres
from ._sdist import limits_sdist

#: Upstream's test files that exercise a storage (the others parse strings and limits).
FILES = (
    "tests/test_strategy.py",
    "tests/test_storage.py",
    "tests/aio/test_strategy.py",
    "tests/aio/test_storage.py",
)
#: Upstream's run takes about a minute of sleeps (windows expiring); a loaded machine more.
RUN_TIMEOUT_S = 900.0


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_the_limits_packages_own_tests_pass_on_postgresql(postgres_server: TempPostgres) -> None:
    root = limits_sdist()
    found = re.search(r"limits-([0-9][^/]*)$", str(root.resolve()))
    assert found is not None and found.group(1) == version("limits"), (
        f"{root} is not the sdist of the installed limits {version('limits')}"
    )
    with postgres_server.schema_url("u_") as url:
        environment = dict(
            os.environ,
            ORBIT_UPSTREAM_PG_URL=url,
            PYTHONPATH=str(Path(__file__).resolve().parent),  # the plugin, by its name
        )
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "_pg_upstream_plugin", "--noconftest",
             "-o", "addopts=", "-p", "no:cacheprovider", "-p", "no:xdist", "-k", "in-memory",
             "-q", "-rfE", *FILES],
            cwd=root, env=environment, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
            check=False,
        )  # fmt: skip
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    print(f"limits {version('limits')}'s own tests on postgresql://: {summary}")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert re.search(r"\b[1-9][0-9]* passed", summary), summary
    assert "failed" not in summary and "error" not in summary, summary
