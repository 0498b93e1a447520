"""One renewer per process (per event loop for asyncio) keeps every auto-renewed lock.

Real stores, real processes: 1,000 locks of three stores renewed by one thread; a
forked child renews only its own locks; a process stopped longer than a ttl
reports the lapse when it runs again, after another process took the lock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from orbitive.store import AsyncLock, Lock, Store, open_store

from .._processes import Channel, Processes
from ._workers import PATIENCE_S

TTL_S = 2.0


def _renewers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "orbitive-renewer"]


def test_one_thread_renews_a_thousand_locks_of_three_stores_on_time(
    shm_url: str, sqlite_url: str, tmp_path: Path
) -> None:
    counts = {shm_url: 250, sqlite_url: 375, f"sqlite://{tmp_path}/second.db": 375}
    stores = [open_store(url) for url in counts]
    others = {thread.ident for thread in threading.enumerate()} - {
        thread.ident for thread in _renewers()
    }
    held: list[Lock] = []
    try:
        for store, count in zip(stores, counts.values(), strict=True):
            held += [store.lock(f"many/{n}", ttl=TTL_S, timeout=0) for n in range(count)]
        assert len(held) == 1000
        time.sleep(2 * TTL_S)  # two whole windows: every lock renewed several times
        assert [lock for lock in held if lock.lost] == []
        assert all(lock.remaining() > 0.0 for lock in held)
        for store, count in zip(stores, counts.values(), strict=True):
            statistics = store.statistics()
            assert statistics.held_count == count
            assert statistics.lost_count == 0
            assert statistics.renewed_count >= 3 * count  # every ttl/3, for two ttls
            assert len(store.locks()) == count  # the engine agrees: all still held
        assert len(_renewers()) == 1
        new = {t.ident for t in threading.enumerate()} - others - {_renewers()[0].ident}
        assert new == set()  # no thread per lock, nor any other
    finally:
        for lock in held:
            lock.release()
        for store in stores:
            store.close()


def test_taking_and_releasing_a_renewed_lock_starts_no_thread(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    with store.lock("warm", ttl=TTL_S, timeout=0):
        pass  # the process's renewer exists from here on
    started: list[str] = []
    original = threading.Thread.start

    def counting_start(thread: threading.Thread) -> None:
        started.append(thread.name)
        original(thread)

    monkeypatch.setattr(threading.Thread, "start", counting_start)
    for _ in range(100):
        with store.lock("churn", ttl=TTL_S, timeout=1.0) as lock:
            assert not lock.lost
    assert started == []
    assert store.statistics().released_count >= 101


def fork_and_renew(channel: Channel, url: str, result: str) -> None:
    """Hold "parent", fork; the child holds "child" for 2.5 ttls and writes what it saw."""
    store = open_store(url)
    store.lock("parent", ttl=1.0, timeout=0)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            lock = store.lock("child", ttl=1.0, timeout=0)
            time.sleep(2.5)
            seen = {
                "child_lost": lock.lost,
                "child_held": store.inspect("child") is not None,
                "parent_held": store.inspect("parent") is not None,
                "renewers": len(_renewers()),
            }
            Path(result).write_text(json.dumps(seen))
            code = 0
        finally:
            os._exit(code)
    channel.send(("forked", pid))
    channel.recv(None)


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # 3.12+: fork with threads
def test_a_forked_child_renews_only_its_own_locks(store_url: str, tmp_path: Path) -> None:
    result = tmp_path / "child.json"
    with Processes("fork") as processes:
        parent = processes.start(fork_and_renew, store_url, str(result))
        said, _ = parent.recv()
        assert said == "forked"
        # Its own renewer no longer renews "parent". A kill, not a stop: a process stopped
        # inside a SQLite write would keep the database's write lock, and the child's
        # renewals would wait for it until its lease lapsed.
        os.kill(parent.pid, signal.SIGKILL)
        deadline = time.monotonic() + PATIENCE_S
        while not result.exists():
            assert time.monotonic() < deadline, "the forked child never reported"
            time.sleep(0.05)
    time.sleep(0.05)  # written just before the child exits: read it whole
    seen = json.loads(result.read_text())
    assert seen == {"child_lost": False, "child_held": True, "parent_held": False, "renewers": 1}


def hold_and_report_loss(channel: Channel, url: str) -> None:
    """Hold "stall" (ttl 0.5 s, renewed); report its token, then what a loss did and
    the warnings logged."""
    losses: list[int] = []
    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("orbitive.store").addHandler(handler)
    with open_store(url) as store:
        lock = store.lock("stall", ttl=0.5, timeout=0, on_lost=lambda lost: losses.append(1))
        channel.send(("held", lock.fencing_token))
        channel.recv(None)  # after the stop and the continue
        deadline = time.monotonic() + PATIENCE_S
        while not losses and time.monotonic() < deadline:
            time.sleep(0.01)
        channel.send(("after", lock.lost, len(losses), lock.release(), warnings))


def test_a_stall_longer_than_the_ttl_reports_the_lapse(store_url: str) -> None:
    with Processes("fork") as processes, open_store(store_url) as mine:
        stalled = processes.start(hold_and_report_loss, store_url)
        said, token = stalled.recv()
        assert said == "held"
        os.kill(stalled.pid, signal.SIGSTOP)
        try:
            time.sleep(1.0)  # two ttls: nothing renews it
            taken = mine.try_lock("stall", "meanwhile", 30.0)
            assert taken is not None and taken.fencing_token > token
        finally:
            os.kill(stalled.pid, signal.SIGCONT)
        stalled.send("go on")
        said, lost, calls, released, warnings = stalled.recv()
        assert (said, lost, calls, released) == ("after", True, 1, False)  # one on_lost
        # Logged once, as what it was: a renewal too late, not an unreachable store.
        assert len(warnings) == 1, warnings
        assert "is lost: its TTL ran out before it was renewed" in warnings[0]
        assert mine.inspect("stall") is not None  # the renewer did not take it back
        assert taken.release()


def test_one_renewer_task_per_loop_keeps_every_async_lock(store: Store) -> None:
    async def main() -> tuple[list[list[str]], list[AsyncLock]]:
        held = [await store.lock_async(f"async/{n}", ttl=TTL_S, timeout=0) for n in range(50)]
        samples = []
        for _ in range(20):  # two whole windows
            await asyncio.sleep(TTL_S / 10)
            samples.append([task.get_name() for task in asyncio.all_tasks()])
        for lock in held:
            await lock.release()
        return samples, held

    samples, held = asyncio.run(main())
    # Never two: the task ends only when no lock is queued (all 50 renewals in flight at
    # once, as when a loaded loop wakes it late), and the first renewal back starts it.
    assert all(names.count("orbitive-renewer") <= 1 for names in samples)
    assert any(names.count("orbitive-renewer") == 1 for names in samples)
    # main, the renewer and the renewals in flight now and then: no task per lock
    assert min(len(names) for names in samples) == 2
    assert [lock for lock in held if lock.lost] == []
    assert store.statistics().renewed_count >= 3 * 50
