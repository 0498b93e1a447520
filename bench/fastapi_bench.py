"""FastAPI on asyncpg under ``uvicorn --workers 2``: orbitive's host-wide pool against
per-process ``asyncpg.create_pool`` and PgBouncer, one workload, one run.

64 keep-alive clients (``tests/clients/_http.py``) send ``GET /q/N`` to 2 uvicorn
workers for a few seconds each; every request checks a connection out, runs
``SELECT $1::int`` and releases it (``bench/_fastapi_app.py``). The cap is 4:

* orbitive: ``orbitive.clients.asyncpg.create_pool`` with ``max_live=4`` host-wide
  (and, as ``orbitive/Ns``, with the turn ``handoff_after=N``);
* asyncpg: ``asyncpg.create_pool(max_size=4)`` in each worker (uncapped: 8 host-wide);
* PgBouncer in transaction mode with ``default_pool_size = 4``, each worker's asyncpg
  pool with ``statement_cache_size=0`` (transaction mode keeps no prepared statement)
  and up to 64 client connections, so PgBouncer queues.

Every contender releases as asyncpg does by default (a session reset, one round
trip). Reported: requests/s over the measured window (after a warm-up), p50 and p99
latency, the peak server connections (counted exactly from the server's log:
``bench.clients_bench.ConnectionLog``), failed requests. Then an acquire + release
of an idle connection in one process, orbitive's pool against
``asyncpg.create_pool``, with asyncpg's default reset and with a ``reset`` hook
that does nothing (the pools' own work).

Run: ``.venv/bin/python -m bench.fastapi_bench [--seconds S] [--repeat N] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench._measure import Skip
from bench.clients_bench import LOG_SETTINGS, ConnectionLog, drained
from bench.readiness_wake import remove_fleet_files
from orbitive import Fleet
from orbitive.clients import PoolOptions
from orbitive.clients.asyncpg import create_pool
from tests._servers import ServerUnavailable, TempPgBouncer, TempPostgres
from tests.clients._http import run_load
from tests.docs._recipes import free_port, started

ROOT = Path(__file__).resolve().parent.parent
CAP = 4
CLIENTS = 64
WARM_UP_S = 1.5
FLEET = f"bench-fastapi-{os.getpid()}"


def serve(kind: str, url: str, directory: Path, turn: float) -> tuple[int, Any]:
    """uvicorn with 2 workers over ``bench/_fastapi_app.py``; (port, its context)."""
    port = free_port()
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        DATABASE_URL=url,
        BENCH_KIND=kind,
        BENCH_CAP=str(CAP),
        BENCH_FLEET=FLEET,
        BENCH_TURN=str(turn),
    )
    command = [sys.executable, "-m", "uvicorn", "bench._fastapi_app:app", "--workers", "2"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--no-access-log"]
    return port, started(command, directory, env, port)


def run_row(label: str, pg: TempPostgres, seconds: float) -> dict[str, Any] | None:
    """One contender: warm up, measure ``seconds``, stop (None: skipped)."""
    kind, _, turn = label.partition("/")
    drained(pg.url)
    bouncer = None
    if kind == "pgbouncer":
        try:
            bouncer = TempPgBouncer.start(pg, CAP)  # transaction mode, CAP server connections
        except ServerUnavailable as why:
            print(f"PgBouncer skipped: {why}")
            return None
    url = pg.url if bouncer is None else bouncer.url
    log = ConnectionLog(pg)
    try:
        with tempfile.TemporaryDirectory(prefix="orbit-bench-") as directory:
            port, server = serve(kind, url, Path(directory), float(turn.rstrip("s") or 0.5))
            with server:
                asyncio.run(run_load(port, lambda n: f"/q/{n}", CLIENTS, seconds=WARM_UP_S))
                load = asyncio.run(run_load(port, lambda n: f"/q/{n}", CLIENTS, seconds=seconds))
    finally:
        if bouncer is not None:
            bouncer.stop()
        remove_fleet_files(FLEET)
    latencies = sorted(load.latencies)
    failed = sum(load.statuses.values()) - load.statuses[200] + len(load.errors)
    return {
        "contender": label,
        "requests_per_s": len(latencies) / seconds,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
        "max_ms": 1000 * latencies[-1],
        "peak_connections": log.peak(),
        "failed": failed,
    }


async def _per_pair(pool: Any, count: int) -> tuple[float, float]:
    """µs of wall and of this process's CPU one acquire + release of an idle connection
    takes, over ``count`` pairs."""
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        async with pool.acquire():
            pass
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return wall / count * 1e6, cpu / count * 1e6


async def _no_reset(conn: Any) -> None:
    """A reset hook that does nothing: the release runs no query (only a needed rollback)."""


async def micro(url: str, rounds: int = 7, count: int = 2000) -> dict[str, tuple[float, float]]:
    """Acquire + release of an idle connection: orbitive and asyncpg, both resets; the
    medians over ``rounds`` interleaved rounds of (wall µs, CPU µs) per pair."""
    with Fleet.join(FLEET, capacity=4) as fleet:
        pools: dict[str, Any] = {}
        for label, reset in (("reset", None), ("no reset", _no_reset)):
            options = PoolOptions(max_live=1)
            pools[f"orbitive, {label}"] = await create_pool(
                url, fleet=fleet, options=options, reset=reset, key=label
            )
            pools[f"asyncpg, {label}"] = await asyncpg.create_pool(
                url, min_size=1, max_size=1, reset=reset
            )
        samples: dict[str, list[tuple[float, float]]] = {label: [] for label in pools}
        for pool in pools.values():
            await _per_pair(pool, 200)  # warm
        for _ in range(rounds):  # interleaved: the neighbours' load moves every row alike
            for label, pool in pools.items():
                samples[label].append(await _per_pair(pool, count))
        for pool in pools.values():
            await pool.close()
    remove_fleet_files(FLEET)
    return {
        label: (
            statistics.median(wall for wall, _ in found),
            statistics.median(cpu for _, cpu in found),
        )
        for label, found in samples.items()
    }


def main() -> None:
    """Run every contender, print the tables, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--repeat", type=int, default=1, help="rounds of every row, interleaved")
    parser.add_argument("--turn", type=float, default=0.1, help="the orbitive/Ns row's turn")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--pairs-only", action="store_true", help="only the acquire + release")
    args = parser.parse_args()
    try:
        pg = TempPostgres.start(*LOG_SETTINGS, "max_connections=200")
    except ServerUnavailable as error:
        raise Skip(str(error)) from None
    rows: list[dict[str, Any]] = []
    labels = ("pgbouncer", "asyncpg", "orbitive", f"orbitive/{args.turn:g}s")
    try:
        print(f"FastAPI, uvicorn --workers 2, {CLIENTS} clients, cap {CAP}, {args.seconds:g} s")
        print(f"{'contender':<16} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
              f"{'peak':>5} {'failed':>6}")  # fmt: skip
        for _ in range(0 if args.pairs_only else args.repeat):
            for label in labels:
                row = run_row(label, pg, args.seconds)
                if row is None:
                    continue
                rows.append(row)
                print(f"{label:<16} {row['requests_per_s']:>8,.0f} {row['p50_ms']:>7.2f} "
                      f"{row['p99_ms']:>7.1f} {row['max_ms']:>7.0f} "
                      f"{row['peak_connections']:>5} {row['failed']:>6}")  # fmt: skip
        drained(pg.url)
        pairs = asyncio.run(micro(pg.url))
    finally:
        pg.stop()
    print("acquire + release of an idle connection, one process (median µs per pair):")
    print(f"  {'pool':<20} {'wall':>8} {'CPU':>8}")
    for label, (wall, cpu) in pairs.items():
        print(f"  {label:<20} {wall:8.1f} {cpu:8.1f}")
    for reset_label in ("reset", "no reset"):
        ours, theirs = pairs[f"orbitive, {reset_label}"], pairs[f"asyncpg, {reset_label}"]
        print(f"  orbitive / asyncpg, {reset_label}: {ours[0] / theirs[0]:.2f}x wall, "
              f"{ours[1] / theirs[1]:.2f}x CPU")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "pairs": pairs}, indent=2))


if __name__ == "__main__":
    main()
