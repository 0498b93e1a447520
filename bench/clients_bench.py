"""The client pool against PgBouncer and per-process psycopg_pool, one workload, one run.

8 worker processes run short queries for a few seconds each: ``SELECT 1``, and two
of about 1 ms, one that keeps the server busy (a count over ``generate_series(1,
7000)``, 0.5 to 0.9 ms of backend CPU here, by the hour) and one that leaves it idle
(``pg_sleep(0.001)``: the backend sleeps in the kernel, and its sleep loop makes it
about 2.2 ms here). Against:

* PgBouncer (Debian's ``pgbouncer``, started here on 127.0.0.1) in transaction
  mode with ``default_pool_size`` = the cap; each worker keeps one client
  connection to it (no client-side pool, and no prepared statements, which
  transaction mode cannot keep);
* per-process psycopg_pool (``max_size`` = the cap in every process: uncapped,
  8 x its size host-wide);
* orbitive's ``ConnectionPool`` with the same host-wide cap (``check=None``,
  as psycopg_pool's default), with the default ``handoff_after`` and, as
  ``orbitive/Ns``, with ``handoff_after=N`` (``--handoff-after``, default 0.1):
  how many seconds a client may still serve its process while another process
  waits at the cap, before it is closed for that waiter (its turn);
* the same pool in transaction mode (``orbitive txn``: ``mode="transaction"``): each
  statement runs on an idle server connection of any worker, carried there by the
  workers' routers (docs/clients.md).

Every contender runs the same request: one autocommit statement (a pool's
``connection()`` block then commits nothing, as a direct connection would not).

Reported: requests/s, p50/p99/p99.9 and the longest latency of one checkout +
query + return, the peak server connections (counted exactly from the server's
log of backend starts and ends: :class:`ConnectionLog`), and the fairness: the
fewest requests one worker completed over the most (1.0: every worker served
alike; in a closed loop a worker left waiting adds few samples, so the
percentiles alone hide it). Then the cost of a checkout/return of an idle local
client beside a bare ``LockTable`` pair.

Run: ``.venv/bin/python -m bench.clients_bench [--seconds S] [--handoff-after S]
[--repeat N] [--query LABEL ...] [--cap N] [--json PATH]``; ``--cap`` sets every
contender's cap (default 4; at 8 each worker may keep a connection of its own);
``--repeat`` runs every row N times, interleaved, then prints each contender's mean
and its ratio to PgBouncer's round by round; ``--query`` runs only the queries named
(their labels); PostgreSQL and PgBouncer are started and stopped here (a missing
binary skips that contender with the reason).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import multiprocessing
import os
import statistics
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psycopg

from bench._measure import Skip
from bench.readiness_wake import remove_fleet_files
from orbitive import Fleet
from orbitive.clients import ClientPool, PoolOptions
from orbitive.clients._psycopg_connections import await_gone, watch_socket
from orbitive.clients.psycopg import ConnectionPool
from orbitive.lock import LockKey, LockOwner, LockTable
from tests._servers import ServerUnavailable, TempPgBouncer, TempPostgres

WORKERS = 8
CAP = 4
QUERIES = {
    "SELECT 1": "SELECT 1",
    "~1 ms busy": "SELECT count(*) FROM generate_series(1, 7000)",
    "~1 ms sleep": "SELECT pg_sleep(0.001)",
}
CONTEXT = multiprocessing.get_context("spawn")
TAG = "orbit-bench-clients"
#: Server settings that log every backend's start and end (see :class:`ConnectionLog`).
LOG_SETTINGS = ("log_connections=on", "log_disconnections=on", "log_line_prefix=[%p] ")


# -- the workers ----------------------------------------------------------------------


def _loop(use: Callable[[], None], until: float) -> list[float]:
    latencies = []
    while (started := time.perf_counter()) < until:
        use()
        latencies.append(time.perf_counter() - started)
    return latencies


def worker(
    conn: Connection, kind: str, url: str, fleet_name: str, query: str, cap: int = CAP
) -> None:
    """One worker process: warm up, wait for the start time, run queries until the common
    end time (a worker that starts late must not run a window of its own), report."""
    kwargs: dict[str, Any] = {"application_name": TAG, "autocommit": True}
    with contextlib.ExitStack() as stack:
        use = _contender(stack, kind, url, fleet_name, query, kwargs, cap)
        use()  # warm: connect before the clock starts
        conn.send("warm")
        start, end = conn.recv()
        time.sleep(max(0.0, start - time.time()))
        conn.send(_loop(use, time.perf_counter() + (end - time.time())))


def _contender(
    stack: contextlib.ExitStack,
    kind: str,
    url: str,
    fleet_name: str,
    query: str,
    kwargs: dict[str, Any],
    cap: int,
) -> Callable[[], None]:
    if kind == "pgbouncer":
        client = stack.enter_context(psycopg.connect(url, prepare_threshold=None, **kwargs))

        def direct() -> None:
            client.execute(query).fetchall()

        return direct
    pool: Any
    if kind == "psycopg_pool":
        import psycopg_pool  # noqa: PLC0415 - only this contender needs it

        pool = stack.enter_context(
            psycopg_pool.ConnectionPool(url, min_size=1, max_size=cap, kwargs=kwargs, open=True)
        )
    else:
        name, _, turn = kind.partition("/")
        options = PoolOptions(max_live=cap)
        if name == "orbitive txn":
            options = dataclasses.replace(options, mode="transaction")
        if turn:
            options = dataclasses.replace(options, handoff_after=float(turn.removesuffix("s")))
        fleet = stack.enter_context(Fleet.join(fleet_name, 16))
        pool = stack.enter_context(
            ConnectionPool(url, fleet=fleet, kwargs=kwargs, options=options, check=None)
        )

    def use() -> None:
        with pool.connection() as client:
            client.execute(query).fetchall()

    return use


class ConnectionLog:
    """The server's peak of client backends during a run, counted exactly from its log.

    The server logs every backend's start and end (:data:`LOG_SETTINGS`). Replaying the
    log from its first line, a session counts from its ``connection authorized`` line
    to its ``disconnection`` line (a probe that never starts a session logs neither):
    the peak is the
    most counted at once from the run's start on. A sampler polling
    ``pg_stat_activity`` every few ms would miss short overlaps and load the two
    cores the contenders share.
    """

    def __init__(self, server: TempPostgres) -> None:
        self._path = server.root / "server.log"
        self._start = self._path.stat().st_size

    def peak(self) -> int:
        """The most client backends at once since this log was opened."""
        live: set[bytes] = set()
        highest = read = 0
        with self._path.open("rb") as log:
            for line in log:
                read += len(line)
                pid, _, message = line.partition(b"] ")
                if b"connection authorized:" in message:
                    live.add(pid)
                elif b"disconnection:" in message:
                    live.discard(pid)
                if read > self._start:
                    highest = max(highest, len(live))
        return highest


def run_contender(
    kind: str, url: str, pg: TempPostgres, query: str, seconds: float, cap: int = CAP
) -> dict[str, Any]:
    """8 workers of one contender on one query; throughput, p50, p99, peak connections."""
    fleet_name = f"bench-clients-{os.getpid()}"
    pipes, procs = [], []
    for _ in range(WORKERS):
        parent, child = CONTEXT.Pipe()
        proc = CONTEXT.Process(target=worker, args=(child, kind, url, fleet_name, query, cap))
        proc.start()
        pipes.append(parent)
        procs.append(proc)
    try:
        for pipe in pipes:  # every worker connected and warm
            if not pipe.poll(60) or pipe.recv() != "warm":
                raise RuntimeError(f"a {kind} worker did not warm up within 60 s")
        connections = ConnectionLog(pg)
        start = time.time() + 0.5
        for pipe in pipes:
            pipe.send((start, start + seconds))
        per_worker = [pipe.recv() for pipe in pipes]
        highest = connections.peak()
    finally:
        for proc in procs:
            proc.join(30)
            if proc.exitcode is None:
                proc.kill()
        remove_fleet_files(fleet_name)
    latencies = sorted(lat for done in per_worker for lat in done)
    counts = [len(done) for done in per_worker]
    return {
        "contender": kind,
        "query": query,
        "requests_per_s": len(latencies) / seconds,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
        "p999_ms": 1000 * latencies[int(len(latencies) * 0.999)],
        "max_ms": 1000 * latencies[-1],
        "peak_connections": highest,
        "fairness": min(counts) / max(counts),
    }


# -- checkout/return against a LockTable pair -------------------------------------------


def micro(rounds: int = 20000) -> dict[str, float]:
    """Median µs of an idle local checkout + return, and of a LockTable acquire + release."""
    name = f"bench-micro-{os.getpid()}"
    with Fleet.join(name, 4) as fleet:
        pool: ClientPool[object]
        with ClientPool(fleet, "micro", create=object, close=lambda client: None) as pool:
            with pool.client():
                pass
            checkout = _median(lambda: _cycle(pool), rounds)
        table = LockTable(fleet)
        key, owner = LockKey("bench", "micro"), LockOwner.random()

        def pair() -> None:
            table.release(table.try_acquire(key, owner, 30.0).lease)

        lock_pair = _median(pair, rounds)
        table.close()
    remove_fleet_files(name)
    return {"checkout_return_us": checkout, "lock_pair_us": lock_pair}


def _cycle(pool: ClientPool[object]) -> None:
    client = pool.getconn()
    pool.putconn(client)


def _median(step: Callable[[], None], rounds: int) -> float:
    runs = []
    for _ in range(7):
        started = time.perf_counter()
        for _ in range(rounds // 7):
            step()
        runs.append((time.perf_counter() - started) / (rounds // 7) * 1e6)
    return statistics.median(runs)


def drained(url: str, timeout: float = 20.0) -> None:
    """Wait until the server has no client backend (the last run's are gone, and so is the
    one that asked: its end is logged before the run's :class:`ConnectionLog` opens)."""
    deadline = time.monotonic() + timeout
    conn = psycopg.connect(url, autocommit=True)
    sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
        "AND pid <> pg_backend_pid()"
    )
    while (row := conn.execute(sql).fetchone()) and row[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = watch_socket(conn)
    conn.close()
    await_gone(gone)  # the server logs the end of a session before it closes its socket


def run_row(
    kind: str, pg: TempPostgres, query: str, seconds: float, cap: int = CAP
) -> dict[str, Any] | None:
    """One contender on one query, PgBouncer started for its row only (None: skipped)."""
    drained(pg.url)
    if kind != "pgbouncer":
        return run_contender(kind, pg.url, pg, query, seconds, cap)
    try:
        bouncer = TempPgBouncer.start(pg, cap)  # transaction mode, cap server connections
    except ServerUnavailable as why:
        print(f"PgBouncer skipped: {why}")
        return None
    try:
        return run_contender(kind, bouncer.url, pg, query, seconds, cap)
    finally:
        bouncer.stop()


def main() -> None:
    """Run every contender on every query, print the table, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--handoff-after", type=float, default=0.1)
    parser.add_argument(
        "--repeat", type=int, default=1, help="rounds of every row, interleaved (then a summary)"
    )
    parser.add_argument(
        "--query", choices=QUERIES, action="append", help="only these queries (repeatable)"
    )
    parser.add_argument(
        "--cap", type=int, default=CAP, help=f"server connections host-wide (default {CAP})"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    try:
        pg = TempPostgres.start(*LOG_SETTINGS)
    except ServerUnavailable as error:
        raise Skip(str(error)) from None
    kinds = (
        "pgbouncer",
        "psycopg_pool",
        "orbitive",
        f"orbitive/{args.handoff_after:g}s",
        "orbitive txn",
    )
    try:
        for label in args.query or QUERIES:
            query = QUERIES[label]
            for _ in range(args.repeat):
                for kind in kinds:
                    row = run_row(kind, pg, query, args.seconds, args.cap)
                    if row is not None:
                        row["query"] = label
                        rows.append(row)
                        print_row(row)
            if args.repeat > 1:
                summarise([row for row in rows if row["query"] == label])
    finally:
        pg.stop()
    figures = micro()
    ratio = figures["checkout_return_us"] / figures["lock_pair_us"]
    print(
        f"idle local checkout + return {figures['checkout_return_us']:.2f} µs, "
        f"LockTable pair {figures['lock_pair_us']:.2f} µs ({ratio:.2f}x)"
    )
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows, "micro": figures}, indent=2))


def print_row(row: dict[str, Any]) -> None:
    print(
        f"{row['query']:<12} {row['contender']:<14} {row['requests_per_s']:>9,.0f} req/s  "
        f"p50 {row['p50_ms']:6.2f}  p99 {row['p99_ms']:7.2f}  "
        f"p99.9 {row['p999_ms']:7.2f}  max {row['max_ms']:7.1f} ms  "
        f"peak {row['peak_connections']} connections  "
        f"fairness {row['fairness']:.2f}",
        flush=True,
    )


def summarise(rows: list[dict[str, Any]]) -> None:
    """Per contender of one query: the mean throughput over its rounds, its ratio to
    PgBouncer's round by round (each pair ran back to back), the median p99."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_kind.setdefault(row["contender"], []).append(row)
    bouncer = by_kind.get("pgbouncer")
    for kind, mine in by_kind.items():
        throughput = [row["requests_per_s"] for row in mine]
        line = (
            f"{rows[0]['query']:<12} {kind:<14} mean {statistics.mean(throughput):>9,.0f} req/s"
            f"  median p99 {statistics.median(row['p99_ms'] for row in mine):7.2f} ms"
        )
        if bouncer is not None and len(bouncer) == len(mine):
            pairs = zip(mine, bouncer, strict=True)
            ratios = [a["requests_per_s"] / b["requests_per_s"] for a, b in pairs]
            line += f"  x PgBouncer {statistics.mean(ratios):.2f} ({min(ratios):.2f} - "
            line += f"{max(ratios):.2f})"
        print(line, flush=True)


if __name__ == "__main__":
    main()
