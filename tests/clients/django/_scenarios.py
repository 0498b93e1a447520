"""The engine's scenarios, each run in a fresh interpreter by ``test_engine.py``.

``python -m tests.clients.django._scenarios NAME`` configures Django from the
environment the test sets (the server's port, a database of the test's own,
a tag for ``application_name``, ``OPTIONS["pool"]`` as JSON), then runs the
scenario; an assertion that fails exits non-zero with its traceback. A fresh
interpreter per scenario gives each one its own Django settings, and lets the
test choose the Django version with ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Final, TypeVar

import django
import psycopg
from django.conf import settings
from django.db import DatabaseError, OperationalError, connection, connections, transaction

from orbitive.clients import PoolTimeout
from orbitive.clients.psycopg import ConnectionPool

T = TypeVar("T")
Scenario = Callable[[], None]

TAG: Final = os.environ["ORBIT_DJANGO_TAG"]
PORT: Final = int(os.environ["ORBIT_DJANGO_PORT"])
SCENARIOS: dict[str, Scenario] = {}


def scenario(function: Scenario) -> Scenario:
    SCENARIOS[function.__name__] = function
    return function


def configure() -> None:
    """Django's settings for one database that uses the engine, from the environment."""
    options = {"pool": json.loads(os.environ["ORBIT_DJANGO_POOL"]), "application_name": TAG}
    database = {
        "ENGINE": "orbitive.clients.django",
        "NAME": os.environ["ORBIT_DJANGO_DB"],
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": PORT,
        "CONN_HEALTH_CHECKS": os.environ.get("ORBIT_DJANGO_HEALTH_CHECKS") == "1",
        "OPTIONS": options,
    }
    settings.configure(
        DATABASES={"default": database},
        INSTALLED_APPS=["tests.clients.django.ledger"],
        USE_TZ=False,  # the connections' time zone follows TIME_ZONE, as in Django's own tests
        TIME_ZONE="UTC",
        DEFAULT_AUTO_FIELD="django.db.models.AutoField",
    )
    django.setup()


# -- what the scenarios observe ----------------------------------------------------------


def pool() -> ConnectionPool:
    found = connection.pool  # type: ignore[attr-defined]  # the engine's wrapper
    assert isinstance(found, ConnectionPool)
    return found


def backend() -> int:
    """The server process of this thread's connection (connecting if needed)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


def server(query: str, *args: object) -> Any:
    """One value from a query on a connection of the test's own, outside any pool."""
    url = f"postgresql://postgres@127.0.0.1:{PORT}/postgres"
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query, args).fetchone()
    assert row is not None
    return row[0]


def server_count() -> int:
    """The server's sessions that the engine opened (tagged)."""
    return int(server("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", TAG))


def in_thread(work: Callable[[], T]) -> T:
    """``work()`` in a thread of its own (its own Django connection, closed after)."""
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, work()))
        except BaseException as error:
            outcome.append((False, error))
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    done, value = outcome[0]
    if not done:
        raise value
    return value  # type: ignore[no-any-return]


def causes(error: BaseException) -> Iterator[BaseException]:
    found: BaseException | None = error
    while found is not None:
        yield found
        found = found.__cause__


@contextmanager
def interrupted_after(seconds: float) -> Iterator[None]:
    """Raise KeyboardInterrupt in this thread after ``seconds``, as Ctrl-C would."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def accounts() -> None:
    """Create the ledger's table with accounts a (100) and b (0)."""
    from tests.clients.django.ledger.models import Account  # noqa: PLC0415 - after setup

    with connection.schema_editor() as editor:
        editor.create_model(Account)
    Account.objects.bulk_create([Account(name="a", balance=100), Account(name="b", balance=0)])


def lock_taken_elsewhere() -> bool:
    """Whether account a's row is locked by another transaction (tried without waiting)."""
    from tests.clients.django.ledger.models import Account  # noqa: PLC0415 - after setup

    try:
        with transaction.atomic():
            Account.objects.select_for_update(nowait=True).get(name="a")
    except DatabaseError:
        return True
    return False


# -- the scenarios -----------------------------------------------------------------------


@scenario
def close_hands_the_connection_back_to_the_pool() -> None:
    first = backend()
    connection.close()
    assert connection.connection is None
    stats = pool().statistics()
    assert (stats.live, stats.idle, stats.in_use) == (1, 1, 0), stats
    assert backend() == first  # the pool's idle connection, not a new one
    assert server_count() == 1


@scenario
def each_request_ends_by_handing_its_connection_back() -> None:
    from django.core.signals import request_finished, request_started  # noqa: PLC0415

    backends = set()
    for _ in range(3):
        request_started.send(sender=None)
        backends.add(backend())
        request_finished.send(sender=None)  # close_old_connections(): CONN_MAX_AGE is 0
        assert connection.connection is None
    assert len(backends) == 1
    assert pool().statistics().idle == 1


@scenario
def the_cap_holds_and_a_waiter_past_the_timeout_gets_operational_error() -> None:
    holding, release = threading.Barrier(3), threading.Event()
    held: list[int] = []

    def hold() -> None:
        with transaction.atomic():
            held.append(backend())
            holding.wait(10)
            release.wait(10)

    threads = [threading.Thread(target=lambda: in_thread(hold)) for _ in range(2)]
    for thread in threads:
        thread.start()
    holding.wait(10)
    started = time.monotonic()
    try:
        backend()
    except OperationalError as error:
        waited = time.monotonic() - started
        assert any(isinstance(cause, PoolTimeout) for cause in causes(error)), repr(error)
    else:
        raise AssertionError("a third connection was made at max_live=2")
    assert 0.4 <= waited < 5.0, waited  # the pool's timeout, 0.5 s
    assert server_count() == 2
    release.set()
    for thread in threads:
        thread.join(10)
    assert backend() in held  # one of the two, handed back
    assert server_count() <= 2


@scenario
def row_locks_server_side_cursors_listen_and_advisory_locks_keep_working() -> None:
    from tests.clients.django.ledger.models import Account  # noqa: PLC0415 - after setup

    accounts()
    mine = backend()

    with transaction.atomic():
        Account.objects.select_for_update().get(name="a")
        assert in_thread(lock_taken_elsewhere)  # the row lock is this connection's
        names = [one.name for one in Account.objects.order_by("name").iterator(chunk_size=1)]
        assert names == ["a", "b"]  # a named cursor, fetched a row at a time
        assert backend() == mine
    assert not in_thread(lock_taken_elsewhere)  # released with the transaction
    names = [one.name for one in Account.objects.order_by("name").iterator(chunk_size=1)]
    assert names == ["a", "b"]  # a WITH HOLD cursor, in autocommit
    with connection.cursor() as cursor:
        cursor.execute("LISTEN ledger")
        in_thread(lambda: connection.cursor().execute("NOTIFY ledger, 'posted'"))
        notices = list(connection.connection.notifies(timeout=10, stop_after=1))
        assert [notice.payload for notice in notices] == ["posted"]
        cursor.execute("UNLISTEN *")
        cursor.execute("SELECT pg_advisory_lock(42)")
        taken = "SELECT pg_try_advisory_lock(42)"
        assert in_thread(lambda: connection.cursor().execute(taken).fetchone()) == (False,)
        cursor.execute("SELECT pg_advisory_unlock(42)")
    assert backend() == mine


@scenario
def a_forked_child_never_uses_its_parents_pool_or_connection() -> None:
    held = backend()  # checked out by this wrapper, across the fork
    parents = pool()
    idle = in_thread(backend)  # handed back: an idle connection of the parent's pool
    assert parents.statistics().idle == 1
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            report: dict[str, object] = {"forgot": connection.connection is None}
            report["own_pool"] = pool() is not parents
            report["backend"] = backend()
            connection.close()
            connection.close_pool()  # type: ignore[attr-defined]  # the engine's wrapper
            os.write(writer, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(writer)
    select.select([reader], [], [], 30)
    report = json.loads(os.read(reader, 4096))
    os.waitpid(child, 0)
    assert report["forgot"] and report["own_pool"], report
    assert report["backend"] not in (held, idle)
    assert backend() == held  # the parent's connection still speaks, on its backend
    assert parents.statistics().idle == 1
    alive = "SELECT count(*) FROM pg_stat_activity WHERE pid IN (%s, %s)"
    assert server(alive, held, idle) == 2


@scenario
def an_interrupted_query_hands_its_connection_back_once() -> None:
    try:
        with interrupted_after(0.3), transaction.atomic():
            connection.cursor().execute("SELECT pg_sleep(10)")
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("not interrupted")
    connection.close()
    stats = pool().statistics()
    assert stats.in_use == 0 and stats.live == stats.idle, stats
    assert (
        server(
            "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(10)' "
            "AND state = 'active'"
        )
        == 0
    )
    backend()  # and the next request is served
    connection.close()
    assert server_count() == pool().statistics().live


@scenario
def an_interrupted_wait_leaves_no_waiter_and_no_claim() -> None:
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        backend()
        taken.set()
        release.wait(10)

    thread = threading.Thread(target=lambda: in_thread(hold))
    thread.start()
    taken.wait(10)
    try:
        with interrupted_after(0.3):
            backend()  # waits at max_live=1
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("not interrupted")
    stats = pool().statistics()
    assert (stats.waiting, stats.creating, stats.live) == (0, 0, 1), stats
    release.set()
    thread.join(10)
    backend()
    assert pool().statistics().live == 1


@scenario
def a_new_time_zone_reaches_new_connections() -> None:
    from django.test.utils import override_settings  # noqa: PLC0415 - after setup

    def zone() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW TIME ZONE")
            row = cursor.fetchone()
        assert row is not None
        return str(row[0])

    assert zone() == "UTC"
    connection.close()
    with override_settings(TIME_ZONE="Africa/Nairobi"):
        assert zone() == "Africa/Nairobi"
        connection.close()
    assert zone() == "UTC"


@scenario
def health_checks_replace_a_connection_the_server_ended() -> None:
    first = backend()
    connection.close()  # idle in the pool
    server("SELECT pg_terminate_backend(%s)", first)
    gone = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
    deadline = time.monotonic() + 10
    while server(gone, first) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert backend() != first  # no error: the checkout's check found it dead


@scenario
def pool_false_opens_and_closes_each_connection() -> None:
    assert connection.pool is None  # type: ignore[attr-defined]  # the engine's wrapper
    backend()
    assert server_count() == 1
    connection.close()
    deadline = time.monotonic() + 10
    while server_count() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server_count() == 0


@scenario
def a_failed_connect_raises_psycopgs_error_and_leaves_no_claim() -> None:
    try:
        backend()
    except OperationalError as error:
        assert isinstance(error.__cause__, psycopg.OperationalError), repr(error.__cause__)
        assert "does not exist" in str(error)
    else:
        raise AssertionError("connected to a database that does not exist")
    stats = pool().statistics()
    assert (stats.live, stats.creating, stats.create_errors_count) == (0, 0, 1), stats


@scenario
def a_fleet_of_another_capacity_is_improperly_configured_at_the_first_connection() -> None:
    from django.core.exceptions import ImproperlyConfigured  # noqa: PLC0415

    try:
        backend()
    except ImproperlyConfigured as error:
        assert "OPTIONS['pool']['fleet_capacity']" in str(error), str(error)
        assert "has capacity 4; joining with 64" in str(error), str(error)
    else:
        raise AssertionError("joined a fleet of capacity 4 with capacity 64")
    assert server_count() == 0


@scenario
def transaction_mode_keeps_what_a_session_holds_on_shared_connections() -> None:
    """``mode="transaction"``, ``max_live`` 2: row locks inside ``atomic()``, a
    ``.iterator()`` cursor inside and outside it, ``LISTEN``/``NOTIFY`` and a session
    advisory lock keep working, each on the connection that holds it, and another
    thread's transactions never find them; the server never sees more than 2."""
    from tests.clients.django.ledger.models import Account  # noqa: PLC0415 - after setup

    accounts()
    assert pool().clients.label.endswith("(router clients)")  # the router's clients

    with transaction.atomic():
        Account.objects.select_for_update().get(name="a")
        mine = backend()
        assert in_thread(lock_taken_elsewhere)  # the row lock is this transaction's
        names = [one.name for one in Account.objects.order_by("name").iterator(chunk_size=1)]
        assert names == ["a", "b"] and backend() == mine  # one connection all along
    assert not in_thread(lock_taken_elsewhere)  # released with the transaction
    names = [one.name for one in Account.objects.order_by("name").iterator(chunk_size=1)]
    assert names == ["a", "b"]  # a WITH HOLD cursor, in autocommit: pinned while open
    with connection.cursor() as cursor:
        cursor.execute("LISTEN ledger")  # pins: notifications reach this client
        in_thread(lambda: connection.cursor().execute("NOTIFY ledger, 'posted'"))
        notices = list(connection.connection.notifies(timeout=10, stop_after=1))
        assert [notice.payload for notice in notices] == ["posted"]
        cursor.execute("SELECT pg_advisory_lock(42)")
        taken = "SELECT pg_try_advisory_lock(42)"
        assert in_thread(lambda: connection.cursor().execute(taken).fetchone()) == (False,)
        cursor.execute("SELECT pg_advisory_unlock(42)")
    channels = "SELECT count(*) FROM pg_listening_channels()"
    assert in_thread(lambda: connection.cursor().execute(channels).fetchone()) == (0,)
    with transaction.atomic():
        Account.objects.filter(name="a").update(balance=90)
        Account.objects.filter(name="b").update(balance=10)
    assert sorted(Account.objects.values_list("name", "balance")) == [("a", 90), ("b", 10)]
    assert server_count() <= 2


def main(name: str) -> None:
    configure()
    SCENARIOS[name]()
    print(f"{name}: ok on Django {django.get_version()}")


if __name__ == "__main__":
    main(sys.argv[1])
