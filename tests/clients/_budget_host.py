"""One simulated host of the budget tests: ``python -m tests.clients._budget_host CONFIG``.

The test starts it in a mount namespace of its own with a private ``/dev/shm``
(see ``_budget_hosts``), so its fleet shares no memory with the other hosts'.
It forks ``workers`` processes; each joins the host's fleet, opens a psycopg
``ConnectionPool`` naming the budget (with the config's ``connection_class``,
``module:name``, if it gives one: ``bench/budget_bench.py`` runs a design
without a budget so), and runs what the host's mode file says:

* ``busy``: one request after another (``with pool.connection()``, one
  statement), counting successes, errors and each request's latency;
* ``idle``: no request (the idle connections stay in the pool);
* ``stop``: close the pool and end.

Every 50 ms a thread of each worker writes what it saw (``stats-{index}.json``):
its counts, the host's census and budget numbers from ``pool.statistics()``, the
``time.monotonic()`` of its first success after it turned busy (a worker waiting
for a connection still reports), and the p50 and p99 latency of its requests since
then. CLOCK_MONOTONIC
is one clock for the whole machine, so the test compares it with its own.

No test framework is imported here.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg

from orbitive import Fleet, OrbitError
from orbitive.clients import Budget, PoolOptions
from orbitive.clients.psycopg import ConnectionPool

#: Seconds between two stats files of a worker, and between two looks at the mode.
EVERY_S = 0.05
#: Nodes of a host's fleet: its workers and a few spares.
CAPACITY = 16


def write_json(path: Path, value: object) -> None:
    """Write ``value`` to ``path`` at once (a reader never sees half a file)."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(value))
    temporary.replace(path)


def percentile(values: list[float], share: float) -> float:
    """The ``share`` percentile of ``values`` (0 for none)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def open_pool(config: dict[str, Any], fleet: Fleet) -> ConnectionPool:
    """The worker's pool, as the config says.

    Raises:
        OrbitError: the pool refused to open (a budget's named errors).
    """
    budget = Budget(**config["budget"]) if config["budget"] is not None else None
    module, _, name = (config.get("connection_class") or "psycopg:Connection").partition(":")
    return ConnectionPool(
        config["db"],
        fleet=fleet,
        connection_class=getattr(importlib.import_module(module), name),
        kwargs={"application_name": config["tag"]},
        options=PoolOptions(**config["options"]),
        budget=budget,
    )


def work(config: dict[str, Any], index: int) -> None:
    """One worker of the host (see the module); SIGUSR1 dumps its threads' stacks to stderr."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    folder = Path(config["folder"])
    stats_path = folder / f"stats-{index}.json"
    fleet = Fleet.join(config["fleet"], CAPACITY)
    counts: dict[str, Any] = {"ok": 0, "errors": {}, "first_ok_at": None, "busy_at": None}
    latencies: list[float] = []
    try:
        pool = open_pool(config, fleet)
    except OrbitError as error:
        write_json(stats_path, {"refused": f"{type(error).__name__}: {error}"})
        return
    mode, seen = "idle", 0.0
    stopped = threading.Event()
    reporter = threading.Thread(
        target=reporting, args=(stopped, stats_path, pool, counts, latencies), daemon=True
    )
    reporter.start()
    while True:
        now = time.monotonic()
        if now - seen >= EVERY_S:
            seen = now
            mode = (folder / "mode").read_text().strip()
            if mode == "busy" and counts["busy_at"] is None:
                counts["busy_at"], counts["first_ok_at"] = now, None
                latencies.clear()  # the percentiles are of this busy spell
            elif mode != "busy":
                counts["busy_at"] = None
        if mode == "stop":
            break
        if mode == "busy":
            started = time.monotonic()
            try:
                with pool.connection(timeout=config["timeout"]) as conn:
                    conn.execute(config["statement"])
            except (OrbitError, psycopg.Error) as error:
                name = type(error).__name__
                counts["errors"][name] = counts["errors"].get(name, 0) + 1
            else:
                done = time.monotonic()
                latencies.append(done - started)
                counts["ok"] += 1
                if counts["first_ok_at"] is None:
                    counts["first_ok_at"] = done
        else:
            time.sleep(0.01)
    stopped.set()
    reporter.join()
    report(stats_path, pool, counts, latencies)
    pool.close()
    fleet.close()


def reporting(
    stopped: threading.Event,
    path: Path,
    pool: ConnectionPool,
    counts: dict[str, Any],
    latencies: list[float],
) -> None:
    """Write the worker's stats file every :data:`EVERY_S` until ``stopped``."""
    while not stopped.wait(EVERY_S):
        report(path, pool, counts, latencies)


def report(
    path: Path, pool: ConnectionPool, counts: dict[str, Any], latencies: list[float]
) -> None:
    """Write the worker's stats file."""
    try:
        stats = pool.statistics().as_dict()
    except OrbitError:
        stats = {}
    clients = pool._clients  # which worker is the host's steward, for the pause tests
    allowance = None if clients is None else clients._ledger.allowance
    write_json(
        path,
        {
            **counts,
            "errors": dict(counts["errors"]),
            "at": time.monotonic(),
            "p50": percentile(list(latencies), 0.5),
            "p99": percentile(list(latencies), 0.99),
            "stats": stats,
            "pid": os.getpid(),
            "steward": allowance is not None and allowance.steward,
        },
    )


def main() -> None:
    config = json.loads(sys.argv[1])
    folder = Path(config["folder"])
    context = multiprocessing.get_context("fork")
    workers = [
        context.Process(target=work, args=(config, index), daemon=True)
        for index in range(config["workers"])
    ]
    for worker in workers:
        worker.start()
    write_json(folder / "pids.json", [os.getpid(), *(worker.pid for worker in workers)])
    signal.signal(signal.SIGTERM, lambda *_: (folder / "mode").write_text("stop"))
    for worker in workers:
        worker.join()


if __name__ == "__main__":
    main()
