"""orbitive.celery.Singleton in a real Celery worker: ``celery -A tests.celery._app worker``
(prefork, 4 children) on the session's Redis as broker and result backend, with the
run locks on SHM and on PostgreSQL.

Each body records its interval (``time.monotonic()``, one clock for the host), its
process and its fencing token in a SQLite file; the tests read the intervals back and
look at the store. Every test here starts processes: never quick. Each has its own
key, and each xdist process its own worker, queue, store (SHM fleet, PostgreSQL
schema), records file and Redis, so they run in the parallel pass; the ones that
bound a time against a lease or a delivery (a SIGKILLed child's lease lapsing
within one TTL, renewals of a 2 s lease, a redelivery within 3 s) are ``serial``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from celery.result import AsyncResult

from orbitive.celery import Singleton
from orbitive.cli._tasks_command import task_keys
from orbitive.store import LockInfo, Store, open_store

from .._fleets import new_fleet_name, remove_fleet_files
from .._servers import TempPostgres, TempRedis
from . import _app

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]


class Run(NamedTuple):
    """One body's record."""

    task: str
    key: str
    task_id: str
    pid: int
    token: int | None
    started: float
    ended: float | None
    lost: int | None


@dataclass
class Worker:
    """A running worker and what the test process needs to call and watch it."""

    store_url: str
    records: Path
    log: Path

    def runs(self, key: str) -> list[Run]:
        """Every run of ``key`` recorded so far, in the order they started."""
        if not self.records.exists():
            return []
        conn = _app.connect(self.records)
        try:
            rows = conn.execute("SELECT * FROM runs WHERE key = ? ORDER BY started", (key,))
            return [Run(*row) for row in rows.fetchall()]
        finally:
            conn.close()

    def holder(self, task: Singleton, key: str) -> LockInfo | None:
        """The live run lock of ``task`` on ``key`` (the tasks below key on ``key`` alone
        or take it as their only other argument than ``hold_s``)."""
        with open_store(self.store_url) as store:
            return store.inspect(_lock_name(task, key))


def _lock_name(task: Singleton, key: str) -> str:
    if task.unique_on is None:
        raise AssertionError(f"{task.name}: keyed on every argument; use unique_on")
    return task.lock_name((key, 0.0), {})


def wait_until(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``predicate`` every 20 ms until it returns a true value; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def module_postgres_url(postgres_server: TempPostgres) -> Iterator[str]:
    """A store URL on a fresh schema of the session's PostgreSQL, dropped afterwards."""
    with postgres_server.schema_url("celery_") as url:
        yield url


@pytest.fixture(scope="module", params=["shm", "postgres"])
def worker(
    request: pytest.FixtureRequest,
    redis_server: TempRedis,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Worker]:
    """A prefork worker of 4 children on its own queue, its store on the engine named."""
    fleet = None
    if request.param == "shm":
        fleet = new_fleet_name()
        store_url = f"shm://{fleet}?capacity=32"
    else:
        store_url = request.getfixturevalue("module_postgres_url")
    folder = tmp_path_factory.mktemp(f"celery-{request.param}")
    records, log = folder / "records.db", folder / "worker.log"
    queue = f"q-{secrets.token_hex(4)}"
    env = {
        **os.environ,
        "ORBIT_CELERY_BROKER": redis_server.url,
        "ORBIT_CELERY_QUEUE": queue,
        "ORBIT_CELERY_STORE": store_url,
        "ORBIT_CELERY_RECORDS": str(records),
    }
    command = [
        sys.executable, "-m", "celery", "-A", "tests.celery._app", "worker",
        "--pool=prefork", "--concurrency=4", "--loglevel=INFO", "-Q", queue,
        "-n", f"{queue}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    conf = _app.app.conf
    saved = {key: conf.get(key) for key in ("orbitive_store_url", "task_default_queue")}
    conf.update(
        broker_url=redis_server.url,
        result_backend=redis_server.url,
        orbitive_store_url=store_url,
        task_default_queue=queue,
    )
    with log.open("wb") as output:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        ready = records.with_name(records.name + ".ready")
        deadline = time.monotonic() + 60.0
        while not ready.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the worker did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.05)
        yield Worker(store_url, records, log)
    finally:
        _stop(process)
        conf.update(saved)
        if fleet is not None:
            remove_fleet_files(fleet)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Cold shutdown (SIGQUIT) of the worker we started, then SIGKILL to its group."""
    if process.poll() is None:
        process.send_signal(signal.SIGQUIT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=15.0)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # the group our Popen made: its children
    process.wait(timeout=15.0)


def _fire(task: Singleton, key: str, hold_s: float, calls: int) -> list[AsyncResult[Any]]:
    """``calls`` calls of ``task`` with the same key from 8 threads at once."""
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(task.apply_async, (key, hold_s), {"note": n}) for n in range(calls)]
        return [future.result() for future in futures]


def _resolve(
    worker: Worker, task: Singleton, key: str, results: list[AsyncResult[Any]], within: float
) -> None:
    """Wait until every result in ``results`` is ready (at most ``within`` seconds), and
    fail fast when one is lost: not ready while nothing holds the key (neither the run
    lock nor the queue marker) for 15 s on end, so no call of the key is left to run.

    Raises:
        Failed (pytest.fail): a lost or late result, naming its task id and whether the
            worker received it.
    """
    pending = {result.id: result for result in results}
    name = _lock_name(task, key)
    deadline = time.monotonic() + within
    idle_since: float | None = None
    with open_store(worker.store_url) as store:
        while True:
            pending = {id_: result for id_, result in pending.items() if not result.ready()}
            if not pending:
                return
            now = time.monotonic()
            busy = store.inspect(name) or store.inspect(f"{name}/queued")
            idle_since = None if busy else (idle_since or now)
            if now > deadline or (idle_since is not None and now - idle_since > 15.0):
                log = worker.log.read_text()
                ran = {run.task_id for run in worker.runs(key)}
                lost = [
                    f"{id_} (received by the worker: {f'[{id_}] received' in log},"
                    f" ran: {id_ in ran})"
                    for id_ in sorted(pending)
                ]
                why = "nothing holds the key" if idle_since is not None else "out of time"
                pytest.fail(f"{len(lost)} result(s) never stored ({why}): {', '.join(lost)}")
            time.sleep(0.1)


def _one_at_a_time(runs: list[Run]) -> None:
    """The recorded intervals never overlap, and each run's token beats the one before."""
    assert all(run.ended is not None for run in runs), runs
    for before, after in itertools.pairwise(runs):
        assert before.ended is not None
        assert after.started >= before.ended, f"overlap: {before} and {after}"
        assert before.token is not None and after.token is not None
        assert after.token > before.token


@pytest.mark.parametrize("mode", ["queued", "skipped", "waited"])
def test_200_calls_with_the_same_key_fired_at_once_run_one_at_a_time(
    worker: Worker, mode: str
) -> None:
    task: Singleton = getattr(_app, mode)
    key = f"k-{uuid.uuid4()}"
    hold_s = {"queued": 0.3, "skipped": 0.05, "waited": 0.01}[mode]
    results = _fire(task, key, hold_s, 200)
    _resolve(worker, task, key, results, 240.0)
    for result in results:
        result.get(timeout=1)  # a failed run raises here
    runs = worker.runs(key)
    _one_at_a_time(runs)
    ran = {run.task_id for run in runs}
    assert len(ran) == len(runs)  # each task id ran once
    if mode == "queued":  # the duplicates got the result of a call that was queued or ran
        assert ran == {result.id for result in results}
        assert len(ran) < 200
    elif mode == "skipped":
        assert 1 <= len(runs) < 200
    else:
        assert len(runs) == 200
    assert worker.holder(task, key) is None


@pytest.mark.serial
def test_a_sigkilled_childs_lock_is_free_within_one_ttl_and_the_next_call_runs(
    worker: Worker,
) -> None:
    task = _app.killable
    key = f"k-{uuid.uuid4()}"
    task.apply_async((key, 120.0))
    (run,) = wait_until(lambda: worker.runs(key), 30.0, "the first call starts")
    holder = worker.holder(task, key)
    assert holder is not None and holder.owner.startswith(f"{run.task_id} ")
    os.kill(run.pid, signal.SIGKILL)
    killed = time.monotonic()
    wait_until(lambda: worker.holder(task, key) is None, task.ttl + 5.0, "the lease lapses")
    assert time.monotonic() - killed <= task.ttl + 1.0  # within one TTL (+1 s of polling)
    task.apply_async((key, 0.2))
    runs = wait_until(
        lambda: [r for r in worker.runs(key) if r.ended is not None], 30.0, "the next call runs"
    )
    assert runs[0].token is not None and run.token is not None and runs[0].token > run.token


@pytest.mark.serial
def test_a_task_running_three_times_its_ttl_keeps_its_lock(worker: Worker) -> None:
    task = _app.short_ttl  # ttl 2 s (renewed every 0.67 s), keyed on every argument
    key = f"k-{uuid.uuid4()}"
    hold_s = 3.5 * task.ttl
    task.apply_async((key, hold_s))
    name = task.lock_name((key, hold_s), {})
    with open_store(worker.store_url) as store:
        first = wait_until(lambda: store.inspect(name), 30.0, "the call takes its lock")
        seen: list[LockInfo] = []
        while not [r for r in worker.runs(key) if r.ended is not None]:
            holder = store.inspect(name)
            if holder is None:
                break
            seen.append(holder)
            time.sleep(0.05)
        (run,) = worker.runs(key)
        assert run.ended is not None and run.ended - run.started >= hold_s
        assert run.lost == 0 and run.token == first.fencing_token
        assert {holder.fencing_token for holder in seen} == {first.fencing_token}
        assert seen[-1].expires_at > first.expires_at  # renewed
        wait_until(lambda: store.inspect(name) is None, 10.0, "the lock is released")


def _started(worker: Worker, key: str) -> Run:
    runs: list[Run] = wait_until(lambda: worker.runs(key), 30.0, "the call starts")
    return runs[0]


def _freed(worker: Worker, store: Store, name: str, within: float, what: str) -> float:
    began = time.monotonic()
    wait_until(lambda: store.inspect(name) is None, within, what)
    return time.monotonic() - began


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGKILL"])
def test_a_revoke_with_terminate_frees_the_lock_long_before_its_ttl(
    worker: Worker, signame: str
) -> None:
    """SIGTERM: the child unwinds (billiard raises SystemExit) and releases; SIGKILL: the
    worker's main process frees the lock on the ``task_revoked`` signal."""
    task = _app.skipped  # ttl 60 s
    key = f"k-{uuid.uuid4()}"
    result = task.apply_async((key, 120.0))
    run = _started(worker, key)
    with open_store(worker.store_url) as store:
        name = _lock_name(task, key)
        assert store.inspect(name) is not None
        (shown,) = [k for k in task_keys(store.locks()) if k.task_id == result.id]  # orbit tasks
        assert (shown.task, shown.state, shown.name) == ("t.skipped", "running", name)
        assert shown.process.startswith(f"{socket.gethostname()}:{run.pid}:")
        _app.app.control.revoke(result.id, terminate=True, signal=signame)
        _freed(worker, store, name, 15.0, "the revoked task's lock is freed")
        assert worker.runs(key) == [run]  # it never ended
        again = task.apply_async((key, 0.1))
        again.get(timeout=30)
        assert len(worker.runs(key)) == 2


@pytest.mark.parametrize(("task_name", "limit_s"), [("limited", 2.0), ("soft", 1.0)])
def test_a_time_limit_frees_the_lock_long_before_its_ttl(
    worker: Worker, task_name: str, limit_s: float
) -> None:
    task: Singleton = getattr(_app, task_name)  # ttl 30 s
    key = f"k-{uuid.uuid4()}"
    task.apply_async((key, 120.0))
    _started(worker, key)
    name = task.lock_name((key, 120.0), {})
    with open_store(worker.store_url) as store:
        assert store.inspect(name) is not None
        _freed(worker, store, name, limit_s + 10.0, "the lock is freed at the time limit")
    (run,) = worker.runs(key)
    assert run.ended is None


@pytest.mark.serial
def test_a_second_delivery_of_a_running_task_id_does_not_run_again(worker: Worker) -> None:
    task = _app.skipped
    key = f"k-{uuid.uuid4()}"
    task_id = str(uuid.uuid4())
    task.apply_async((key, 3.0), task_id=task_id)
    _started(worker, key)
    task.apply_async((key, 3.0), task_id=task_id)  # what a redelivery looks like
    wait_until(lambda: worker.runs(key)[0].ended, 30.0, "the first run ends")
    time.sleep(0.5)
    (run,) = worker.runs(key)
    assert run.task_id == task_id
    assert "this copy is ignored" in worker.log.read_text()


@pytest.mark.parametrize("task_name", ["retried", "retried_skip"])
def test_a_retry_delivered_while_its_first_run_still_holds_the_key_runs_after_it(
    worker: Worker, task_name: str
) -> None:
    """Not taken for a second delivery: the retry took the queue marker for its id."""
    task: Singleton = getattr(_app, task_name)
    key = f"k-{uuid.uuid4()}"
    result = task.apply_async((key, 1.0))
    _resolve(worker, task, key, [result], 60.0)
    first, again = worker.runs(key)
    assert result.get(timeout=1) == again.pid
    assert first.task_id == again.task_id == result.id
    assert first.token is not None and again.token is not None and again.token > first.token
    assert f"[{result.id}] already runs" not in worker.log.read_text()


@pytest.mark.serial
def test_a_redelivery_after_its_child_was_sigkilled_runs_once_the_lease_lapses(
    worker: Worker,
) -> None:
    """acks_late and reject_on_worker_lost: the message comes back at once, while the dead
    child's lease (same task id) still lives; the copy waits it out, then runs."""
    task = _app.late  # ttl 8 s: the message comes back before the lease lapses
    key = f"k-{uuid.uuid4()}"
    task.apply_async((key, 2.0))
    first = _started(worker, key)
    os.kill(first.pid, signal.SIGKILL)
    killed = time.monotonic()
    runs = wait_until(
        lambda: [r for r in worker.runs(key) if r.ended is not None], 30.0, "the copy runs"
    )
    (again,) = runs
    assert again.task_id == first.task_id and again.pid != first.pid
    assert again.token is not None and first.token is not None and again.token > first.token
    assert again.started - killed <= task.ttl + 2.0
