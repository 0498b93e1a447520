"""The wake-ups of semaphore waiters on PostgreSQL (LISTEN/NOTIFY) and Redis (Pub/Sub).

One listening connection per store serves every waiter of the process; it listens
again after the server drops it, ends once no waiter is left, and a forked child
makes its own.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
import redis

from orbitive.store import Store, _notifications, open_store
from orbitive.store._notifications import Notifications

NETWORK_ENGINES = ("postgres", "redis")
LONG = 60.0
#: How soon a notified waiter must hold its slot, in seconds. The tests that check
#: it raise the listening waiters' poll cap to an hour (:func:`no_polls`), so
#: without a notification the next attempt comes only at the holder's expiry,
#: :data:`LONG` seconds after its grant: any bound well below that, however loaded
#: the machine, tells a notified waiter from a polling one.
WOKEN_S = 20.0


@pytest.fixture
def no_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Listening waiters pause for up to an hour: only a notification wakes them."""
    monkeypatch.setattr(_notifications, "LISTENING_CAP_S", 3600.0)


@pytest.fixture(params=NETWORK_ENGINES)
def network_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture
def store(network_url: str) -> Iterator[Store]:
    with open_store(network_url) as opened:
        yield opened


@pytest.fixture
def other(network_url: str) -> Iterator[Store]:
    """A second store on the same server: another client."""
    with open_store(network_url) as opened:
        yield opened


def hub(store: Store) -> Notifications:
    found: Notifications = store._backend.engine._notifications  # type: ignore[attr-defined]
    return found


def eventually(condition: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "the condition never came true"
        time.sleep(0.01)


def wait_in_thread(store: Store, name: str, woken: list[float]) -> threading.Thread:
    """A thread that waits for a slot of ``name`` (limit 1), notes when it got it, releases."""

    def wait() -> None:
        with store.semaphore(name, 1).acquire(ttl=LONG, timeout=2 * LONG):
            woken.append(time.monotonic())

    thread = threading.Thread(target=wait)
    thread.start()
    return thread


def listening_sessions(network_url: str) -> set[int]:
    """The server's ids of the sessions that listen for semaphore releases."""
    if network_url.startswith("postgresql"):
        with psycopg.connect(network_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE query = 'LISTEN orbitive_semaphore'"
            ).fetchall()
        return {pid for (pid,) in rows}
    with redis.Redis.from_url(network_url.split("?", maxsplit=1)[0]) as client:
        return {int(found["id"]) for found in client.client_list(_type="pubsub")}


def drop_listeners(network_url: str, sessions: set[int]) -> None:
    """Have the server close the listening ``sessions``."""
    if network_url.startswith("postgresql"):
        with psycopg.connect(network_url, autocommit=True) as conn:
            for pid in sessions:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    else:
        with redis.Redis.from_url(network_url.split("?", maxsplit=1)[0]) as client:
            for session in sessions:
                client.client_kill_filter(_id=str(session))


def test_one_listening_thread_serves_every_waiter_and_wakes_only_by_name(
    store: Store, no_polls: None
) -> None:
    holders = {name: store.semaphore(name, 1).try_acquire("h", LONG) for name in ("a", "b")}
    woken: dict[str, list[float]] = {"a": [], "b": []}
    threads = [wait_in_thread(store, name, woken[name]) for name in ("a", "a", "b")]
    eventually(lambda: hub(store).listening)
    time.sleep(0.5)  # every waiter pauses now, for up to an hour
    listeners = [t for t in threading.enumerate() if t.name == "orbitive-semaphore-listener"]
    assert len(listeners) == 1
    released = time.monotonic()
    lease = holders["a"]
    assert lease is not None and lease.release()
    eventually(lambda: len(woken["a"]) == 2)
    assert woken["a"][0] - released < WOKEN_S  # the second one after the first released
    assert woken["b"] == []
    lease = holders["b"]
    assert lease is not None and lease.release()
    for thread in threads:
        thread.join(30.0)
    assert len(woken["b"]) == 1


def test_a_dropped_listening_connection_listens_again_and_waiters_are_served(
    store: Store, other: Store, network_url: str, no_polls: None
) -> None:
    holder = other.semaphore("dropped", 1).try_acquire("h", LONG)
    assert holder is not None
    woken: list[float] = []
    before = listening_sessions(network_url)
    thread = wait_in_thread(store, "dropped", woken)
    eventually(lambda: hub(store).listening)
    ours = listening_sessions(network_url) - before
    assert len(ours) == 1
    drop_listeners(network_url, ours)
    eventually(lambda: bool(listening_sessions(network_url) - before - ours))  # a new one
    # The server lists the new session once its LISTEN starts; the thread says it
    # listens once the command has returned to it.
    eventually(lambda: hub(store).listening)
    time.sleep(0.5)
    released = time.monotonic()
    assert holder.release()
    thread.join(30.0)
    assert len(woken) == 1 and woken[0] - released < WOKEN_S


def test_the_listening_thread_ends_once_no_waiter_is_left(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_notifications, "IDLE_S", 0.2)
    holder = store.semaphore("idle", 1).try_acquire("h", LONG)
    assert holder is not None
    woken: list[float] = []
    thread = wait_in_thread(store, "idle", woken)
    eventually(lambda: hub(store).listening)
    assert holder.release()
    thread.join(30.0)
    assert len(woken) == 1
    eventually(lambda: hub(store)._thread is None and not hub(store).listening, within=5.0)
    engine = store._backend.engine
    if hasattr(engine, "_listener"):
        assert engine._listener is None  # the connection was closed with the thread


def test_a_forked_child_listens_on_its_own_connection(
    store: Store, other: Store, no_polls: None
) -> None:
    holder = other.semaphore("family", 1).try_acquire("h", LONG)
    assert holder is not None
    parent_woken: list[float] = []
    parent = wait_in_thread(store, "family", parent_woken)  # the parent listens at the fork
    eventually(lambda: hub(store).listening)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: reports how soon after the release it held a slot
        code = 1
        try:
            os.close(read_end)
            with store.semaphore("family", 1).acquire(ttl=LONG, timeout=2 * LONG):
                os.write(write_end, f"{time.monotonic()}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    time.sleep(2.0)  # both wait, each on its own listening connection
    released = time.monotonic()
    assert holder.release()
    parent.join(30.0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with os.fdopen(read_end) as reading:
        child_woken = float(reading.read())
    first = min([child_woken, *parent_woken])
    assert first - released < WOKEN_S
    assert len(parent_woken) == 1
