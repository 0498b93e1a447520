"""The Celery app of ``test_worker.py``'s real worker (``celery -A tests.celery._app worker``).

Configured from the environment: ``ORBIT_CELERY_BROKER`` (the Redis broker and result
backend), ``ORBIT_CELERY_QUEUE`` (this worker's queue), ``ORBIT_CELERY_STORE`` (the
store URL) and ``ORBIT_CELERY_RECORDS`` (a SQLite file where each body records its
interval, process and fencing token). ``worker_ready`` touches ``<records>.ready``.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import worker_ready

from orbitive.celery import Singleton

RECORDS = Path(os.environ.get("ORBIT_CELERY_RECORDS", "records.db"))
BROKER = os.environ.get("ORBIT_CELERY_BROKER", "redis://127.0.0.1:6379/0")

app = Celery("orbit_celery_tests", broker=BROKER, backend=BROKER)
app.conf.update(
    orbitive_store_url=os.environ.get("ORBIT_CELERY_STORE"),
    task_default_queue=os.environ.get("ORBIT_CELERY_QUEUE", "celery"),
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    result_expires=600,
)

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS runs (task TEXT, key TEXT, task_id TEXT, pid INTEGER,"
    " token INTEGER, started REAL, ended REAL, lost INTEGER)"
)


def connect(path: Path = RECORDS) -> sqlite3.Connection:
    """The records file, created on first use (WAL: bodies of four processes write)."""
    conn = sqlite3.connect(path, timeout=60.0, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(SCHEMA)
    return conn


def _hold(task: Singleton, key: str, hold_s: float) -> int:
    """The body of every task below: record the start, hold, record the end."""
    started = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process of the host
    row = (task.name, key, task.request.id, os.getpid(), task.lock_token, started)
    with connect() as conn:
        conn.execute("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, NULL, NULL)", row)
    conn.close()
    time.sleep(hold_s)
    lock = task.held_lock
    lost = None if lock is None else int(lock.lost)
    with connect() as conn:
        conn.execute(
            "UPDATE runs SET ended = ?, lost = ? WHERE task_id = ? AND pid = ? AND started = ?",
            (time.monotonic(), lost, task.request.id, os.getpid(), started),
        )
    conn.close()
    return os.getpid()


@app.task(base=Singleton, bind=True, name="t.queued", unique_on=["key"], ttl=10.0)
def queued(self: Singleton, key: str, hold_s: float, note: Any = None) -> int:
    """Queue once (the default mode)."""
    return _hold(self, key, hold_s)


def _retry_once(task: Singleton, key: str, hold_s: float) -> int:
    """Record a run; on the first, retry at once (countdown 0) and hold the key ``hold_s``
    seconds more: the retry's message comes while the first run holds it."""
    pid = _hold(task, key, 0.0)
    if task.request.retries == 0:
        retry = task.retry(countdown=0, throw=False)
        time.sleep(hold_s)
        raise retry
    return pid


@app.task(base=Singleton, bind=True, name="t.retried", unique_on=["key"], ttl=10.0)
def retried(self: Singleton, key: str, hold_s: float, note: Any = None) -> int:
    """Queue once, and retry once at once."""
    return _retry_once(self, key, hold_s)


@app.task(
    base=Singleton, bind=True, name="t.retried_skip", unique_on=["key"], lock_mode="skip", ttl=10.0
)
def retried_skip(self: Singleton, key: str, hold_s: float, note: Any = None) -> int:
    """Skip mode, and retry once at once."""
    return _retry_once(self, key, hold_s)


@app.task(base=Singleton, bind=True, name="t.skipped", unique_on=["key"], lock_mode="skip")
def skipped(self: Singleton, key: str, hold_s: float, note: Any = None) -> int:
    """Every call queued; one that finds the key held skips."""
    return _hold(self, key, hold_s)


@app.task(base=Singleton, bind=True, name="t.waited", unique_on=["key"], lock_mode="wait")
def waited(self: Singleton, key: str, hold_s: float, note: Any = None) -> int:
    """Every call queued; one that finds the key held waits for it."""
    return _hold(self, key, hold_s)


@app.task(base=Singleton, bind=True, name="t.short_ttl", lock_mode="skip", ttl=2.0)
def short_ttl(self: Singleton, key: str, hold_s: float) -> int:
    """A lease of 2 s, renewed while the body holds longer."""
    return _hold(self, key, hold_s)


@app.task(
    base=Singleton, bind=True, name="t.killable", unique_on=["key"], lock_mode="skip", ttl=3.0
)
def killable(self: Singleton, key: str, hold_s: float) -> int:
    """A lease of 3 s, for a child killed while it holds it."""
    return _hold(self, key, hold_s)


@app.task(
    base=Singleton,
    bind=True,
    name="t.late",
    unique_on=["key"],
    lock_mode="skip",
    ttl=8.0,
    acks_late=True,
    reject_on_worker_lost=True,
)
def late(self: Singleton, key: str, hold_s: float) -> int:
    """Acknowledged once it ends, and delivered again when its process dies."""
    return _hold(self, key, hold_s)


@app.task(base=Singleton, bind=True, name="t.limited", lock_mode="skip", ttl=30.0, time_limit=2)
def limited(self: Singleton, key: str, hold_s: float) -> int:
    """A hard time limit of 2 s (the pool kills the child) and a lease of 30 s."""
    return _hold(self, key, hold_s)


@app.task(base=Singleton, bind=True, name="t.soft", lock_mode="skip", ttl=30.0, soft_time_limit=1)
def soft(self: Singleton, key: str, hold_s: float) -> int:
    """A soft time limit of 1 s (SoftTimeLimitExceeded raised in the body)."""
    return _hold(self, key, hold_s)


@worker_ready.connect
def _ready(**_: Any) -> None:
    RECORDS.with_name(RECORDS.name + ".ready").touch()
