"""Django's own tests of its database layer, run with the engine and with the stock backend.

Django's sdist ships its test suite. Its ``backends``, ``transactions`` and
``transaction_hooks`` labels run twice on the session's server, at once: with
``django.db.backends.postgresql`` as shipped (no pool) and with
``orbitive.clients.django`` (a host-wide pool). Every test must end the same
way under both, on the environment's Django (5.2 LTS on Python 3.11) and on
the 4.2 LTS line, except the tests of Django's own pool that set
``OPTIONS["pool"]`` to psycopg_pool's values (True, ``min_size``,
``max_size``, ``check``): four from Django 5.1, six from 6.0, which the
engine refuses by design with ``ImproperlyConfigured``. Both runs' outcomes
are kept as JSON beside the test's other files. About 40 s for each version
(the stock run is the slower: it opens a connection for every test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from ..._processes import ROOT
from ..._servers import TempPostgres
from ._sources import LTS_4_2, installed, source

LABELS: Final = ("backends", "transactions", "transaction_hooks")
STOCK: Final = "django.db.backends.postgresql"
ENGINE: Final = "orbitive.clients.django"
#: A whole run's bound, in seconds (about 40 s here for the slower of the two).
RUN_TIMEOUT_S: Final = 400.0

#: The tests of Django's own pool (psycopg_pool, Django 5.1 and later) that set
#: ``OPTIONS["pool"]`` to its values (True, or psycopg_pool's arguments).
PSYCOPG_POOL_TESTS: Final = (
    "test_connect_pool",
    "test_connect_pool_set_to_true",
    "test_connect_pool_with_timezone",
    "test_pooling_health_checks",
    "test_pool_check_can_be_overridden",  # Django 6.0
    "test_pool_options_not_mutated",  # Django 6.0
)
POSTGRESQL_TESTS: Final = "backends.postgresql.tests.Tests."


def _of_djangos_pool(test: str) -> str | None:
    """The name of the psycopg_pool test that ``test`` (or its subtest) is, or None."""
    name = test.split(" ", 1)[0].removeprefix(POSTGRESQL_TESTS)
    return name if test.startswith(POSTGRESQL_TESTS) and name in PSYCOPG_POOL_TESTS else None


def _start(
    tree: Path, engine: str, server: TempPostgres, fleet: str, results: Path
) -> subprocess.Popen[bytes]:
    """Run the labels under ``engine`` from the unpacked sdist ``tree`` (not waited for)."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tree), str(ROOT)]),
        ORBIT_SUITE_ENGINE=engine,
        ORBIT_SUITE_PORT=str(server.port),
        ORBIT_SUITE_PREFIX=f"{fleet}_{'orbit' if engine == ENGINE else 'stock'}",
        ORBIT_SUITE_FLEET=fleet,
        ORBIT_SUITE_RESULTS=str(results),
    )
    command = [sys.executable, "runtests.py", "--settings", "tests.clients.django.suite_settings"]
    command += ["--parallel", "1", "--noinput", "-v", "2", *LABELS]
    log = results.with_suffix(".log").open("wb")
    try:
        return subprocess.Popen(
            command, cwd=tree / "tests", env=env, stdout=log, stderr=subprocess.STDOUT
        )
    finally:
        log.close()


def _outcomes(process: subprocess.Popen[bytes], results: Path) -> dict[str, str]:
    try:
        process.wait(RUN_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    log = results.with_suffix(".log").read_text(errors="replace")
    assert results.exists(), f"the run wrote no results: {log[-3000:]}"
    outcomes: dict[str, str] = json.loads(results.read_text())
    return outcomes


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
@pytest.mark.parametrize("requirement", [installed(), LTS_4_2], ids=["installed", "4.2"])
def test_djangos_database_tests_end_as_with_the_stock_backend(
    requirement: str, postgres_server: TempPostgres, fleet_name: str, tmp_path: Path
) -> None:
    tree = source(requirement)
    stock_file, ours_file = tmp_path / "stock.json", tmp_path / "orbitive.json"
    runs = [
        _start(tree, STOCK, postgres_server, fleet_name, stock_file),
        _start(tree, ENGINE, postgres_server, fleet_name, ours_file),
    ]
    try:
        stock = _outcomes(runs[0], stock_file)
        ours = _outcomes(runs[1], ours_file)
    finally:
        for run in runs:
            if run.poll() is None:
                run.kill()
                run.wait()
    counts = {outcome: list(stock.values()).count(outcome) for outcome in ("passed", "skipped")}
    assert counts["passed"] > 250 and counts["skipped"] > 50, counts  # the suite really ran
    differing = {
        test: (stock.get(test), ours.get(test))
        for test in stock.keys() | ours.keys()
        if stock.get(test) != ours.get(test)
    }
    assert {test: ends for test, ends in differing.items() if not _of_djangos_pool(test)} == {}
    for test, (theirs, mine) in differing.items():  # each ends with the engine's refusal
        assert theirs in ("passed", None), (test, theirs)  # None: a subtest that passed
        assert mine in ("error ImproperlyConfigured", "subtests failed"), (test, mine)
    source_text = (tree / "tests/backends/postgresql/tests.py").read_text()
    present = {name for name in PSYCOPG_POOL_TESTS if f"def {name}(" in source_text}
    assert {_of_djangos_pool(test) for test in differing} == present
