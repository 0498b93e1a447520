"""Fixtures shared by every test directory: fleet names, fleets, tables, child processes,
and the session's PostgreSQL and Redis servers.

Every fleet a test makes gets a fresh name, and every SHM object and lock file
of that name is unlinked afterwards, whether the test passed or not. The servers
(``_servers.py``) start once per session, at the first test that asks; without a
server binary their tests skip, except under ``CI=true``, where they fail.

Under pytest-xdist each worker is a session of its own: its own servers (on free
ports, in temporary directories of their own), its own ``tmp_path`` root, and fleet
names drawn at random, so no two workers share a fleet, a database or a directory.
Collection marks the timing-sensitive tests ``serial`` and the unit tests ``quick``
(see pyproject.toml's markers; scripts/test runs the ``serial`` ones in a pass of their
own, one at a time). A test marked ``quick`` that starts a child process (a fork, a
spawn, a subprocess) fails at teardown: the ``quick`` set stays one of unit tests.

A run whose tests all passed fails all the same when it leaves an SHM object or client
socket of this user in ``/dev/shm`` that was not there when it started: it names them.
Another run at once in the same ``/dev/shm`` shows its objects too (run each in a
private ``/dev/shm``, as scripts/test-pythons does).
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
from collections.abc import Callable, Iterator
from typing import Final, TypeVar

import pytest

from orbitive import Fleet
from orbitive.lock import LockTable

from ._fleets import new_fleet_name, remove_fleet_files, users_objects
from ._processes import START_METHODS, Processes
from ._servers import DURABLE_POSTGRES, ServerUnavailable, TempPostgres, TempRedis, TempServer

_Server = TypeVar("_Server", bound=TempServer)

#: Modules whose tests time a hand-over, a wake-up, fairness or a kill -9 and its lease's
#: lapse: they run one at a time, in scripts/test's second pass (marker ``serial``).
SERIAL_MODULES: Final = frozenset(
    {"test_handover", "test_kill", "test_crash", "test_fairness", "test_wake", "test_waiting"}
)
SERIAL_DIRECTORIES: Final = frozenset({"crash"})
#: Directories of whole-program tests (packaging, docs pages, benchmarks, scripts): never quick.
SLOW_DIRECTORIES: Final = frozenset({"packaging", "docs", "bench", "scripts"})
#: Modules whose tests start child processes or run ``orbit`` and the demo as commands (the
#: guard below names any test that does so while marked quick), or run a model or an
#: exhaustive comparison for seconds: never quick.
WHOLE_PROGRAM_MODULES: Final = frozenset(
    {
        "celery/test_worker",
        "cli/test_clear",
        "cli/test_clear_race",
        "cli/test_closed_pipe",
        "cli/test_demo",
        "cli/test_error_prefix",
        "cli/test_hostile_arguments",
        "cli/test_lock_commands",
        "cli/test_messages",
        "cli/test_run_hardening",
        "clients/test_fork",
        "core/test_creation_race",
        "core/test_environments",
        "core/test_section_corruption",
        "core/test_section_lifetime",
        "core/test_stores",
        "limits/test_postgres_processes",
        "limits/test_processes",
        "limits/test_upstream",
        "limits/test_servers",
        "lock/test_fork_inside",
        "lock/test_model",
        "lock/test_probe_bound",
        "lock/test_processes",
        "lock/test_stripe_bounds",
        "pool/test_model",
        "pool/test_operations",
        "readiness/test_backend_choice",
        "store/test_async_loop",
        "store/test_run",
        "store/test_shm_fork",
        "tests/test_child_modules",
        "tests/test_import_graph",
        "tests/test_shm_leaks",
    }
)
#: Tests, elsewhere among unit tests, that fork, spawn or run a program, or wait seconds on
#: the clock (a renewer's rounds, a waiter's poll interval): never quick.
NOT_UNIT_TESTS: Final = frozenset(
    {
        "clients/test_close::test_the_closes_queued_at_interpreter_exit_are_done_before_it_ends",
        "clients/test_exports::test_the_core_package_does_not_import_the_adapters_dependencies",
        "core/test_fleet::test_a_blocked_child_is_killed_and_reaped_by_the_helper",
        "core/test_fleet::test_a_forked_child_of_a_local_fleet_writes_its_own_copy",
        "core/test_fleet::test_an_execd_program_does_not_inherit_the_node_lock",
        "core/test_fleet::test_forked_child_gets_another_node_and_does_not_inherit_the_node_lock",
        "core/test_fleet::test_forked_child_of_a_full_fleet_keeps_failing_and_never_uses_the_parents_node",
        "core/test_fleet::test_forked_child_of_an_explicit_node_member_gets_fleet_error",
        "core/test_native::test_without_the_c_modules_each_table_kind_warns_once_and_runs_in_python",
        "lock/test_close_while_waiting::test_a_waiter_inside_the_c_operation_gets_fleet_error_after_close",
        "lock/test_types::test_a_bad_environment_override_raises_invalid_layout",
        "lock/test_types::test_environment_overrides_the_default_layout_once_per_process",
        "pool/test_deaths::test_a_live_member_with_an_explicit_incarnation_is_not_reported",
        "pool/test_identity::test_child_gets_its_own_node_and_life_and_cannot_accept_parent_leases",
        "pool/test_identity::test_execution_copied_into_a_child_never_completes_the_parents_unit",
        "pool/test_identity::test_pool_with_explicit_incarnation_refuses_use_in_a_child",
        "pool/test_labels::test_orbit_pool_totals_say_waiting_for_callers_and_parked_for_sleepers",
        "pool/test_labels::test_the_last_label_counts_and_another_process_reads_it",
        "pool/test_layout::test_geometry_comes_from_the_environment_and_bad_values_are_refused",
        "pool/test_layout::test_geometry_variables_are_read_once_per_process_later_changes_ignored",
        "readiness/test_descriptor::test_forked_child_refuses_the_parents_readiness_and_leaves_it_working",
        "store/test_async_contract::test_a_forked_child_uses_the_async_form_on_its_own_connection",
        "store/test_contract::test_forked_child_uses_the_store_on_its_own_connection",
        "store/test_records::test_a_lock_force_released_by_another_process_is_logged_as_lost_by_its_holder",
        "store/test_renewer::test_a_forked_child_renews_only_its_own_locks",
        "store/test_renewer::test_a_stall_longer_than_the_ttl_reports_the_lapse",
        "store/test_renewer::test_one_renewer_task_per_loop_keeps_every_async_lock",
        "store/test_renewer::test_one_thread_renews_a_thousand_locks_of_three_stores_on_time",
        "store/test_semaphore_async::test_an_async_waiter_is_woken_by_a_release_from_another_thread",
        "store/test_semaphore_contract::test_a_waiter_is_woken_by_a_release_not_by_its_next_poll",
        "store/test_semaphore_contract::test_forked_child_takes_a_slot_on_its_own_connection",
    }
)
#: Fixtures that start a server or a child process: a test using one is not quick.
PROCESS_FIXTURES: Final = frozenset(
    {"postgres_server", "redis_server", "durable_postgres_server", "durable_redis_server",
     "processes", "spawned", "prober_process", "hosts"}
)  # fmt: skip


_SHM_AT_START: Final = pytest.StashKey[frozenset[str]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Note this user's SHM objects, in the run's own process (not in an xdist worker)."""
    if not hasattr(session.config, "workerinput"):
        session.config.stash[_SHM_AT_START] = users_objects()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail a passing run that left SHM objects behind (its workers have all ended)."""
    before = session.config.stash.get(_SHM_AT_START, None)
    if before is None or exitstatus != pytest.ExitCode.OK:
        return
    left = sorted(users_objects() - before)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(
                f"the tests left {len(left)} SHM object(s) in /dev/shm: {', '.join(left)}",
                red=True,
            )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the timing-sensitive tests ``serial`` and the unit tests ``quick``."""
    for item in items:
        folder = item.path.parent.name
        if item.path.stem in SERIAL_MODULES or folder in SERIAL_DIRECTORIES:
            item.add_marker(pytest.mark.serial)
        module = f"{folder}/{item.path.stem}"
        fixtures = set(getattr(item, "fixturenames", ()))
        params = getattr(getattr(item, "callspec", None), "params", {})
        on_server_or_child = any(
            type(value) is str and value in ("postgres", "redis", *START_METHODS)
            for value in params.values()
        )
        if not (
            item.get_closest_marker("slow")
            or item.get_closest_marker("serial")
            or folder in SLOW_DIRECTORIES
            or fixtures & PROCESS_FIXTURES
            or module in WHOLE_PROGRAM_MODULES
            or f"{module}::{getattr(item, 'originalname', item.name)}" in NOT_UNIT_TESTS
            or on_server_or_child
        ):
            item.add_marker(pytest.mark.quick)


@pytest.fixture(autouse=True)
def _quick_starts_no_child(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test marked ``quick`` that started a child process (os.fork, a spawn, a
    subprocess): it belongs out of the unit set (``WHOLE_PROGRAM_MODULES``, a fixture of
    ``PROCESS_FIXTURES``)."""
    if request.node.get_closest_marker("quick") is None:
        yield
        return
    started: list[str] = []
    patch = pytest.MonkeyPatch()
    for owner, attribute in (
        (os, "fork"), (os, "posix_spawn"), (os, "posix_spawnp"),
        (_posixsubprocess, "fork_exec"), (subprocess, "_fork_exec"),
    ):  # fmt: skip
        real = getattr(owner, attribute, None)  # subprocess._fork_exec: Python 3.11 and later
        if real is None:
            continue

        def recorded(
            *args: object,
            _real: Callable[..., object] = real,
            _name: str = f"{owner.__name__}.{attribute}",
            **kwargs: object,
        ) -> object:
            started.append(_name)
            return _real(*args, **kwargs)

        patch.setattr(owner, attribute, recorded)
    try:
        yield
    finally:
        patch.undo()
    if started:
        pytest.fail(
            f"marked quick, but started a child process ({', '.join(sorted(set(started)))}):"
            " tests/conftest.py must leave it out of the unit set"
        )


MakeFleet = Callable[..., Fleet]


@pytest.fixture
def fleet_name() -> Iterator[str]:
    """A fleet name of this test only; its objects and lock files are removed afterwards."""
    name = new_fleet_name()
    yield name
    remove_fleet_files(name)


@pytest.fixture(params=["join", "local"])
def make_fleet(request: pytest.FixtureRequest, fleet_name: str) -> Iterator[MakeFleet]:
    """Builds fleets named ``fleet_name`` with Fleet.join or Fleet.local; closes them after."""
    fleets: list[Fleet] = []

    def make(capacity: int = 4) -> Fleet:
        if request.param == "join":
            fleet = Fleet.join(fleet_name, capacity)
        else:
            fleet = Fleet.local(fleet_name, capacity)
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.close()


@pytest.fixture
def table(make_fleet: MakeFleet) -> Iterator[LockTable]:
    """A lock table (default layout) on a joined or a local fleet."""
    opened = LockTable(make_fleet())
    yield opened
    opened.close()
    opened.unlink()


@pytest.fixture
def shared_fleet(fleet_name: str) -> Iterator[Fleet]:
    """This test's SHM fleet (capacity 4), joined by the test process."""
    with Fleet.join(fleet_name, 4) as fleet:
        yield fleet


@pytest.fixture
def shared_table(shared_fleet: Fleet) -> Iterator[LockTable]:
    """The lock table of :func:`shared_fleet`; children open it by name."""
    opened = LockTable(shared_fleet)
    yield opened
    opened.close()
    opened.unlink()


@pytest.fixture(params=START_METHODS)
def processes(request: pytest.FixtureRequest, fleet_name: str) -> Iterator[Processes]:
    """Starts children with the fork or the spawn method; all are reaped afterwards.

    It depends on ``fleet_name`` so that every child is dead before the fleet's
    files are removed: a child still running could create them again.
    """
    del fleet_name
    with Processes(request.param) as started:
        yield started


def _session_server(start: Callable[[], _Server]) -> Iterator[_Server]:
    """A server for the session, stopped at its end; one that will not start (no binary,
    say) skips its tests, but fails them under ``CI=true``."""
    try:
        server = start()
    except ServerUnavailable as error:
        if os.environ.get("CI"):
            pytest.fail(f"server unavailable under CI: {error}")
        pytest.skip(f"server unavailable: {error}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[TempPostgres]:
    """The session's PostgreSQL server (one cluster for every test that needs one)."""
    yield from _session_server(TempPostgres.start)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[TempRedis]:
    """The session's redis-server."""
    yield from _session_server(TempRedis.start)


@pytest.fixture(scope="session")
def durable_postgres_server() -> Iterator[TempPostgres]:
    """A PostgreSQL server with ``fsync`` and ``synchronous_commit`` on: a budget refuses a
    coordinator that may forget what it grants."""
    yield from _session_server(lambda: TempPostgres.start(*DURABLE_POSTGRES))


@pytest.fixture(scope="session")
def durable_redis_server() -> Iterator[TempRedis]:
    """A redis-server with an append-only file, as a budget's coordinator must be."""
    yield from _session_server(lambda: TempRedis.start(appendonly=True))
