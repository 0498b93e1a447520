"""The engine with real Django and PostgreSQL, on the environment's Django and on 4.2 LTS.

Each scenario of ``_scenarios.py`` runs in a fresh interpreter (its own Django
settings), against a database of its own on the session's server; the Django
version is the environment's, or the 4.2 line's from its sdist first on
``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from orbitive import Fleet

from ..._processes import ROOT
from ..._servers import TempPostgres
from ._sources import LTS_4_2, installed, source

#: The environment's Django and the 4.2 LTS line.
VERSIONS = [pytest.param(installed(), id="installed"), pytest.param(LTS_4_2, id="4.2")]


@pytest.fixture(params=VERSIONS)
def django_path(request: pytest.FixtureRequest) -> str:
    """What goes first on the scenarios' PYTHONPATH: nothing, or an unpacked sdist."""
    return "" if request.param == installed() else str(source(request.param))


def run(
    name: str,
    django_path: str,
    postgres_server: TempPostgres,
    database: str,
    tag: str,
    pool: Any,
    health_checks: bool = False,
) -> None:
    """Run scenario ``name``; fail with its output unless it passed."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(part for part in (django_path, str(ROOT)) if part),
        ORBIT_DJANGO_TAG=tag,
        ORBIT_DJANGO_PORT=str(postgres_server.port),
        ORBIT_DJANGO_DB=database,
        ORBIT_DJANGO_POOL=json.dumps(pool),
        ORBIT_DJANGO_HEALTH_CHECKS="1" if health_checks else "0",
    )
    command = [sys.executable, "-m", "tests.clients.django._scenarios", name]
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=90, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"{name}: ok on Django "), done.stdout + done.stderr
    if django_path:
        assert "on Django 4.2." in done.stdout, done.stdout


@pytest.fixture
def scenario(
    django_path: str, postgres_server: TempPostgres, database: str, tag: str, fleet_name: str
) -> Any:
    """Runs a scenario with ``OPTIONS["pool"]`` as given (the test's fleet added), or
    False with ``direct=True``."""

    def go(name: str, health_checks: bool = False, direct: bool = False, **pool: Any) -> None:
        options = False if direct else {"fleet": fleet_name, **pool}
        run(name, django_path, postgres_server, database, tag, options, health_checks)

    return go


def test_close_hands_the_connection_back_to_the_pool(scenario: Any) -> None:
    scenario("close_hands_the_connection_back_to_the_pool")


def test_each_request_ends_by_handing_its_connection_back(scenario: Any) -> None:
    scenario("each_request_ends_by_handing_its_connection_back")


def test_the_cap_holds_and_a_waiter_past_the_timeout_gets_operational_error(
    scenario: Any,
) -> None:
    name = "the_cap_holds_and_a_waiter_past_the_timeout_gets_operational_error"
    scenario(name, max_live=2, timeout=0.5)


def test_row_locks_server_side_cursors_listen_and_advisory_locks_keep_working(
    scenario: Any,
) -> None:
    scenario("row_locks_server_side_cursors_listen_and_advisory_locks_keep_working")


def test_transaction_mode_keeps_what_a_session_holds_on_shared_connections(
    scenario: Any,
) -> None:
    name = "transaction_mode_keeps_what_a_session_holds_on_shared_connections"
    scenario(name, max_live=2, mode="transaction", timeout=10)


def test_a_forked_child_never_uses_its_parents_pool_or_connection(scenario: Any) -> None:
    scenario("a_forked_child_never_uses_its_parents_pool_or_connection")


def test_an_interrupted_query_hands_its_connection_back_once(scenario: Any) -> None:
    scenario("an_interrupted_query_hands_its_connection_back_once")


def test_an_interrupted_wait_leaves_no_waiter_and_no_claim(scenario: Any) -> None:
    scenario("an_interrupted_wait_leaves_no_waiter_and_no_claim", max_live=1)


def test_a_new_time_zone_reaches_new_connections(scenario: Any) -> None:
    scenario("a_new_time_zone_reaches_new_connections")


def test_health_checks_replace_a_connection_the_server_ended(scenario: Any) -> None:
    scenario("health_checks_replace_a_connection_the_server_ended", health_checks=True)


def test_pool_false_opens_and_closes_each_connection(scenario: Any) -> None:
    scenario("pool_false_opens_and_closes_each_connection", direct=True)


def test_a_failed_connect_raises_psycopgs_error_and_leaves_no_claim(
    django_path: str, postgres_server: TempPostgres, tag: str, fleet_name: str
) -> None:
    name = "a_failed_connect_raises_psycopgs_error_and_leaves_no_claim"
    run(name, django_path, postgres_server, "no_such_database", tag, {"fleet": fleet_name})


def test_a_fleet_of_another_capacity_is_improperly_configured_at_the_first_connection(
    scenario: Any, fleet_name: str
) -> None:
    name = "a_fleet_of_another_capacity_is_improperly_configured_at_the_first_connection"
    with Fleet.join(fleet_name, 4):  # the fleet exists with capacity 4
        scenario(name, fleet_capacity=64)
