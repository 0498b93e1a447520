"""Django under gunicorn at a host-wide cap: the engine, Django's own pool, PgBouncer.

8 gunicorn sync workers serve a view doing two ORM queries (``bench/django_site``:
an item by primary key, then the names of the three after it), and a load
generator in this process keeps ``--clients`` requests in flight (each a new
HTTP connection, as gunicorn's sync workers close every one) for ``--seconds``
after a warm-up in which every worker answers. Contenders, each with the cap 4:

* ``orbitive``: ``ENGINE: orbitive.clients.django``, ``max_live`` 4 for the
  whole host, ``CONN_MAX_AGE`` 0 (each request hands its connection back), a
  fleet of 16 nodes (twice the workers, as docs/operations.md sizes it);
* ``orbitive txn``: the same in transaction mode (``mode: "transaction"``): each
  worker's connections go to its process's router, which runs every transaction on
  an idle server connection of any worker (docs/clients.md);
* ``django pool``: Django's own pool (psycopg_pool), ``max_size`` 4 in every
  worker, so uncapped host-wide (8 x 4), ``CONN_MAX_AGE`` 0;
* ``pgbouncer``: Django's stock backend connected to PgBouncer in transaction
  mode with ``default_pool_size`` 4, keeping its connection to it
  (``CONN_MAX_AGE`` 600, server-side cursors off), as it is usually deployed;
* with ``--handoff-after S``, ``orbitive/Ss`` as well: the engine with that turn.

Reported: requests/s, p50, p99 and the longest latency, failed requests, the
peak of server connections while the contender ran (exactly, from the server's
log of session starts and ends: :class:`~bench.clients_bench.ConnectionLog`),
and the CPU that gunicorn, PostgreSQL and PgBouncer spent per request
(:func:`cpu_seconds`), which the other work on the machine moves far less than
the throughput.

Run: ``.venv/bin/python -m bench.django_bench [--seconds S] [--clients N]
[--repeat N] [--handoff-after S] [--json PATH]``; ``--repeat`` runs every row N
times, interleaved, then prints each contender's mean and its ratios, round by
round, to PgBouncer's and to Django's pool's. PostgreSQL and PgBouncer are
started and stopped here (a missing PgBouncer skips its row).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Final

import psycopg

from bench.clients_bench import CAP, LOG_SETTINGS, WORKERS, ConnectionLog, drained
from bench.readiness_wake import remove_fleet_files
from tests._servers import ServerUnavailable, TempPgBouncer, TempPostgres, TempServer, free_port

ROOT: Final = Path(__file__).resolve().parent.parent
ITEMS: Final = 1_000
TAG: Final = "orbit-bench-django"
WARM_UP_S: Final = 1.0
QUERY: Final = "2 ORM queries"


# -- the contenders' settings -------------------------------------------------------------


def database(kind: str, port: int, fleet: str) -> dict[str, Any]:
    """The ``DATABASES["default"]`` entry of one contender (``port``: the server's or
    PgBouncer's)."""
    entry: dict[str, Any] = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "postgres",
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": port,
        "CONN_MAX_AGE": 0,
        "OPTIONS": {"application_name": TAG},
    }
    if kind == "pgbouncer":
        entry |= {"CONN_MAX_AGE": 600, "DISABLE_SERVER_SIDE_CURSORS": True}
    elif kind == "django pool":
        entry["OPTIONS"]["pool"] = {"min_size": 1, "max_size": CAP}
    else:
        name, _, turn = kind.partition("/")
        pool: dict[str, Any] = {"fleet": fleet, "max_live": CAP, "fleet_capacity": 2 * WORKERS}
        if name == "orbitive txn":
            pool["mode"] = "transaction"
        if turn:
            pool["handoff_after"] = float(turn.removesuffix("s"))
        entry["ENGINE"] = "orbitive.clients.django"
        entry["OPTIONS"]["pool"] = pool
    return entry


def fill(url: str) -> None:
    """The site's table with :data:`ITEMS` items (its model's table, made by hand)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS django_site_item")
        conn.execute(
            "CREATE TABLE django_site_item (id bigserial PRIMARY KEY, "
            "name varchar(40) NOT NULL, stock integer NOT NULL)"
        )
        conn.execute(
            "INSERT INTO django_site_item (name, stock) "
            "SELECT 'item ' || n, n %% 97 FROM generate_series(1, %s) AS n",
            (ITEMS,),
        )
        conn.execute("ANALYZE django_site_item")


# -- gunicorn -----------------------------------------------------------------------------


@contextlib.contextmanager
def gunicorn(entry: dict[str, Any], port: int) -> Iterator[subprocess.Popen[bytes]]:
    """The site under gunicorn (8 sync workers) on ``port`` until the block ends."""
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        DJANGO_SETTINGS_MODULE="bench.django_site.settings",
        BENCH_DJANGO_DATABASE=json.dumps(entry),
    )
    command = [sys.executable, "-m", "gunicorn", "-w", str(WORKERS), "-b", f"127.0.0.1:{port}"]
    command += ["--timeout", "60", "--no-control-socket", "bench.django_site.wsgi"]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        _wait_listening(process, port)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)


def _wait_listening(process: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1.0):
            return
        time.sleep(0.1)
    assert process.stderr is not None
    raise RuntimeError(f"gunicorn did not start: {process.stderr.read()[-2000:]!r}")


# -- the load -----------------------------------------------------------------------------


async def _get(port: int, pk: int) -> int | None:
    """One request on a new connection; the worker that answered 200, or None."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        request = f"GET /item/{pk} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
        writer.write(request.encode())
        reply = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    if not reply.startswith(b"HTTP/1.1 200"):
        return None
    worker: int = json.loads(reply.partition(b"\r\n\r\n")[2].split(b"\r\n")[1])["worker"]
    return worker


async def _client(port: int, until: float, done: list[float], workers: set[int]) -> int:
    """Requests until ``until`` (perf_counter seconds); the latencies of the answered ones
    go to ``done`` and their workers to ``workers``; returns how many failed."""
    pick, failed = random.Random(), 0
    while (started := time.perf_counter()) < until:
        try:
            worker = await asyncio.wait_for(_get(port, pick.randint(1, ITEMS - 3)), 60)
        except (OSError, asyncio.TimeoutError):
            worker = None
        if worker is None:
            failed += 1
        else:
            done.append(time.perf_counter() - started)
            workers.add(worker)
    return failed


async def _run(port: int, clients: int, until: float, done: list[float], seen: set[int]) -> int:
    everyone = (_client(port, until, done, seen) for _ in range(clients))
    return sum(await asyncio.gather(*everyone))


def warm(port: int, clients: int) -> None:
    """``clients`` requests in flight until every worker has answered (a second at least)."""
    seen: set[int] = set()
    deadline = time.perf_counter() + 120
    while len(seen) < WORKERS and time.perf_counter() < deadline:
        asyncio.run(_run(port, clients, time.perf_counter() + WARM_UP_S, [], seen))


def measure(port: int, clients: int, seconds: float) -> tuple[list[float], int]:
    """``clients`` requests in flight for ``seconds``; the latencies of the answered ones
    (seconds) and how many failed."""
    done: list[float] = []
    failed = asyncio.run(_run(port, clients, time.perf_counter() + seconds, done, set()))
    return done, failed


def cpu_seconds(groups: Iterable[int]) -> float:
    """User and system CPU seconds of the processes of these process groups so far, with
    what their children that ended used (a closed backend's, a recycled worker's).

    The benchmark shares the machine's two cores with whatever else runs there, which
    moves its throughput by a third from one run to the next; the CPU a contender spends
    per request does not depend on that, and bounds the throughput of a machine that
    runs nothing else.
    """
    wanted, total = set(groups), 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_bytes()
        except OSError:  # ended meanwhile
            continue
        fields = raw[raw.rindex(b")") + 2 :].split()  # from field 3 (state) on
        if int(fields[2]) in wanted:  # field 5, the process group
            total += sum(int(field) for field in fields[11:15])  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


def run_contender(
    kind: str, pg: TempPostgres, clients: int, seconds: float
) -> dict[str, Any] | None:
    """One contender's row (None: skipped, with the reason printed)."""
    drained(pg.url)
    fleet = f"bench-django-{os.getpid()}"
    with contextlib.ExitStack() as stack:
        port, bouncer = pg.port, None
        if kind == "pgbouncer":
            try:
                bouncer = stack.enter_context(_bouncer(pg))
            except ServerUnavailable as why:
                print(f"PgBouncer skipped: {why}")
                return None
            port = bouncer.port
        connections = ConnectionLog(pg)
        http = free_port()
        try:
            with gunicorn(database(kind, port, fleet), http) as server:
                groups = [server.pid, _group(pg), *([_group(bouncer)] if bouncer else [])]
                warm(http, clients)
                used = cpu_seconds(groups)
                latencies, failed = measure(http, clients, seconds)
                used = cpu_seconds(groups) - used
        finally:
            remove_fleet_files(fleet)
        highest = connections.peak()
    latencies.sort()
    return {
        "contender": kind,
        "query": QUERY,
        "requests_per_s": len(latencies) / seconds,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
        "p999_ms": 1000 * latencies[int(len(latencies) * 0.999)],
        "max_ms": 1000 * latencies[-1],
        "failed": failed,
        "peak_connections": highest,
        "cpu_ms_per_request": 1000 * used / max(1, len(latencies)),
    }


def _group(server: TempServer) -> int:
    assert server.process is not None  # started
    return server.process.pid  # it leads its own session


def print_row(row: dict[str, Any]) -> None:
    print(
        f"{row['contender']:<14} {row['requests_per_s']:>7,.0f} req/s  "
        f"p50 {row['p50_ms']:6.2f}  p99 {row['p99_ms']:7.2f}  p99.9 {row['p999_ms']:7.2f}  "
        f"max {row['max_ms']:7.1f} ms  failed {row['failed']}  "
        f"peak {row['peak_connections']} connections  "
        f"CPU {row['cpu_ms_per_request']:.2f} ms/request",
        flush=True,
    )


@contextlib.contextmanager
def _bouncer(pg: TempPostgres) -> Iterator[TempPgBouncer]:
    bouncer = TempPgBouncer.start(pg, CAP)  # transaction mode, CAP server connections
    try:
        yield bouncer
    finally:
        bouncer.stop()


def summarise(rows: list[dict[str, Any]]) -> None:
    """Per contender: mean throughput, median p50/p99, and the ratios (round by round) to
    PgBouncer's and to Django's pool's throughput."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_kind.setdefault(row["contender"], []).append(row)
    for kind, mine in by_kind.items():
        line = (
            f"{kind:<14} mean {statistics.mean(r['requests_per_s'] for r in mine):>7,.0f} req/s"
            f"  median p50 {statistics.median(r['p50_ms'] for r in mine):6.2f}"
            f"  p99 {statistics.median(r['p99_ms'] for r in mine):7.2f} ms"
            f"  peak {max(r['peak_connections'] for r in mine)}"
            f"  CPU {statistics.median(r['cpu_ms_per_request'] for r in mine):.2f} ms/request"
            f"  failed {sum(r['failed'] for r in mine)}"
        )
        for other in ("pgbouncer", "django pool"):
            theirs = by_kind.get(other)
            if theirs is not None and len(theirs) == len(mine) and other != kind:
                ratios = [
                    a["requests_per_s"] / b["requests_per_s"]
                    for a, b in zip(mine, theirs, strict=True)
                ]
                line += f"  x {other} {statistics.mean(ratios):.2f}"
                line += f" ({min(ratios):.2f} - {max(ratios):.2f})"
        print(line, flush=True)


def main() -> None:
    """Run every contender (interleaved rounds), print the rows and the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=16, help="requests in flight")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--handoff-after", type=float, help="add the engine with this turn")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    kinds = ["pgbouncer", "django pool", "orbitive", "orbitive txn"]
    if args.handoff_after is not None:
        kinds.append(f"orbitive/{args.handoff_after:g}s")
    rows: list[dict[str, Any]] = []
    pg = TempPostgres.start(*LOG_SETTINGS)
    try:
        fill(pg.url)
        for _ in range(args.repeat):
            for kind in kinds:
                row = run_contender(kind, pg, args.clients, args.seconds)
                if row is not None:
                    rows.append(row)
                    print_row(row)
    finally:
        pg.stop()
    summarise(rows)
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows}, indent=2))


if __name__ == "__main__":
    main()
