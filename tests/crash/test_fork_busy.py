"""Forks while orbitive's own threads are busy: the child works.

A process forked while one of its threads holds a lock (a gunicorn ``--preload``
master, Celery's prefork pool, ``multiprocessing`` with fork) has that lock held
in the child by a thread the child does not have. Each scenario runs in a child
of the test (the forking process, "the parent") and forks grandchildren from it
while the renewer thread renews, a client pool's upkeep thread and a budget's
steward run; each grandchild must do its work within a bound, or is reported hung.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orbitive import Fleet
from orbitive.clients import ClientPool, PoolOptions
from orbitive.store import Lock, open_store

from .._processes import Channel, Processes, native_stacks, proc_threads
from ..clients._fakes import FakeClient, close

#: How long a grandchild may take for its work before it counts as hung, in seconds.
WORK_WITHIN = 10.0
FORKS = 20
#: A parent's renewed locks, and their ttl: the renewer renews one every 11 ms, each
#: every ttl / 3. The slack a renewal has before its lock lapses is 2/3 of the ttl: 0.2 s
#: (a ttl of 0.3 s) lapsed one in 3 runs with two CPU burners, 0.67 s (1 s) one in a
#: CI run under AddressSanitizer, whose forks are slow: the test's load, not a fork.
LOCKS, TTL = 60, 2.0
#: The ttl of a grandchild's own lock, which it holds past its first renewal.
CHILD_TTL = 1.0

pytestmark = pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # 3.12+


def _in_grandchild(work: Callable[[], None], forked: Callable[[], object] | None = None) -> str:
    """Fork; the grandchild runs ``work()`` and exits 0 (1 when it raised); the parent
    calls ``forked()`` (if given), reaps the grandchild and says how it ended ("ok", "failed", or
    "hung" after WORK_WITHIN seconds, then killed: with its threads' states and native stacks)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            work()
            code = 0
        finally:
            os._exit(code)
    if forked is not None:
        forked()
    deadline = time.monotonic() + WORK_WITHIN
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return "ok" if os.waitstatus_to_exitcode(status) == 0 else "failed"
        time.sleep(0.005)
    diagnosis = "\n".join(["hung:", *proc_threads(pid), native_stacks(pid)])
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return diagnosis


def fork_during_a_blocked_renewal(channel: Channel, url: str) -> None:
    """Hold "held" (renewed); once the test write-locked the database, fork while the
    renewer's renewal of "held" waits for it; the grandchild releases the inherited
    lock, takes and releases one of its own, and reads the store's statistics."""
    store = open_store(url)
    held = store.lock("held", ttl=1.0, timeout=0)
    channel.send("held")
    channel.recv()  # the database is write-locked: the next renewal waits
    deadline = time.monotonic() + WORK_WITHIN
    while not held._mutex.locked():  # the renewer is inside its renewal of "held"
        assert time.monotonic() < deadline, "the renewer never renewed"
        time.sleep(0.001)

    def work() -> None:
        assert isinstance(held.release(), bool)
        with store.lock("mine", ttl=1.0, timeout=5.0):
            pass
        assert store.statistics().acquired_count >= 2

    channel.send(_in_grandchild(work, forked=lambda: channel.send("forked")))


def test_a_child_forked_inside_a_renewal_releases_its_copy_and_locks_anew(
    tmp_path: Path,
) -> None:
    path = tmp_path / "locks.db"
    url = f"sqlite:///{path}"
    with Processes("fork") as processes:
        parent = processes.start(fork_during_a_blocked_renewal, url)
        assert parent.recv() == "held"
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        parent.send("go")
        assert parent.recv() == "forked"
        blocker.execute("ROLLBACK")
        blocker.close()
        assert parent.recv() == "ok"


def fork_while_threads_are_busy(channel: Channel, url: str, fleet_name: str) -> None:
    """Keep the renewer busy with LOCKS locks at TTL and a client pool's upkeep running,
    fork FORKS times, and send how each grandchild ended."""
    store = open_store(url)
    held: list[Lock] = [store.lock(f"held-{n}", ttl=TTL, timeout=0) for n in range(LOCKS)]
    fleet = Fleet.join(fleet_name, 8)
    pool = ClientPool(
        fleet, "fake", create=FakeClient, close=close, options=PoolOptions(max_live=4)
    )
    pool.putconn(pool.getconn())

    def work() -> None:
        with store.lock(f"child-{os.getpid()}", ttl=CHILD_TTL, timeout=5.0) as mine:
            time.sleep(CHILD_TTL / 2)  # past its first renewal, by its own renewer
            assert not mine.lost
        assert held[0].renew(TTL)  # the parent's lock: the same owner and token
        store.statistics()
        client = pool.getconn()
        pool.putconn(client)
        assert pool.statistics().live >= 1

    outcomes = []
    for _ in range(FORKS):
        outcomes.append(_in_grandchild(work))
        time.sleep(0.01)
    assert not any(lock.lost for lock in held)
    channel.send(outcomes)


def test_children_forked_while_the_renewer_and_a_pools_upkeep_run_work(
    tmp_path: Path, fleet_name: str
) -> None:
    url = f"sqlite:///{tmp_path / 'locks.db'}"
    with Processes("fork") as processes:
        parent = processes.start(fork_while_threads_are_busy, url, fleet_name)
        assert parent.recv(120.0) == ["ok"] * FORKS


#: Forks while two threads churn SQLite locks; SQLite calls straddled 46 of 100 forks
#: before they went through a fork gate, and the children hung on the file's mutex.
CHURN_FORKS = 40


def fork_while_threads_churn_sqlite(channel: Channel, url: str) -> None:
    """Two threads take and release locks of one SQLite store without pause; fork
    CHURN_FORKS times (stopping at the first child that did not end "ok"); each
    grandchild opens the file anew and takes a lock. Send the outcomes."""
    store = open_store(url)
    stop = threading.Event()

    def churn(n: int) -> None:
        while not stop.is_set():
            lock = store.try_lock(f"churn-{n}", owner="parent", ttl=5.0)
            if lock is not None:
                lock.release()

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()

    def work() -> None:
        with open_store(url) as own:
            assert own.try_lock(f"child-{os.getpid()}", owner="child", ttl=5.0) is not None

    outcomes: list[str] = []
    try:
        while len(outcomes) < CHURN_FORKS and outcomes.count("ok") == len(outcomes):
            outcomes.append(_in_grandchild(work))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    channel.send(outcomes)


def test_children_forked_while_threads_are_inside_sqlite_open_the_file_and_lock(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'locks.db'}"
    with Processes("fork") as processes:
        parent = processes.start(fork_while_threads_churn_sqlite, url)
        assert parent.recv(120.0) == ["ok"] * CHURN_FORKS
