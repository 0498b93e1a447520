"""One budget across hosts against static per-host caps, and what the coordinator pays (issue 23).

Run: ``.venv/bin/python bench/budget_bench.py [--rounds N] [--seconds S]
[--statement SQL]`` (as root: each host gets a private ``/dev/shm``).

Six simulated hosts (``tests/clients/_budget_hosts.py``) of four worker processes
each run against one throw-away durable PostgreSQL server, each worker sending
one request after another (default ``SELECT pg_sleep(0.02)``):

* **budget**: three hosts with ``max_live=4`` sharing ``Budget(total=6)``, whose
  coordinator is the same server (database ``coord``, so its statements can be
  counted apart);
* **static**: three hosts with ``max_live=2`` each and no budget, PgBouncer's way
  (a fixed share of the same six connections per host).

Each round runs, interleaved (so both see the same machine load), the **even**
load (all three hosts busy) and the **skewed** one (host ``a`` busy, the other
two idle, holding what they held) for both. A phase turns its hosts busy, waits
``--warmup`` seconds (a budget host takes units, idle hosts hand theirs over
within ``handover_within``, 2 s), then counts requests for ``--seconds``. It
prints requests per second, the p99 latency (the highest of the busy workers'
p99s over the whole busy spell, warm-up included: in the even load that follows
a skewed one, hosts ``b`` and ``c`` wait for host ``a`` to hand units over) and
the peak of the variant's connections in ``pg_stat_activity`` (sampled every 5
ms; idle hosts keep their idle connections), and the budget's throughput over
the static one.

Then the **coordinator's cost**: transactions per second per host on the
coordinator's database (``pg_stat_database``; each coordinator call is one
transaction), with the budget hosts steady (all busy), churning (the busy host
changes every second, so units move) and idle. The server flushes these counts
about once a second, so a window of ``--seconds`` is good to about one second's
worth.

Targets (issue 23): skewed, the budget wins by the ratio demand allows (4 / 2 =
2x here: host ``a`` may use ``max_live=4`` of the total, a static host 2; the
verdict allows 5 % less); even, at least 0.95x.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests._servers import DURABLE_POSTGRES, TempPostgres
from tests.clients._budget_hosts import Host
from tests.clients._sampling import ServerConnections

#: Targets of issue 23: the budget's throughput over the static caps'.
EVEN_TARGET = 0.95
SKEWED_TARGET = 1.9  # the 2x that demand allows here, less 5 %


class Variant:
    """Three hosts of one kind (budget or static) and the tag of their connections."""

    def __init__(self, name: str, db: str, budget: dict[str, object] | None, max_live: int,
                 statement: str) -> None:  # fmt: skip
        self.name, self.tag = name, f"bench-{name}-{secrets.token_hex(3)}"
        options = {"max_live": max_live}
        self.hosts = [
            Host(
                f"{name}-{host}",
                db=db,
                budget=budget,
                options=options,
                tag=self.tag,
                statement=statement,
                timeout=60.0,
            )
            for host in "abc"
        ]

    def modes(self, *modes: str) -> None:
        for host, mode in zip(self.hosts, modes, strict=True):
            host.mode(mode)

    def successes(self) -> int:
        return sum(host.successes() for host in self.hosts)

    def p99_ms(self, busy: tuple[str, ...]) -> float:
        """The highest p99 of the busy hosts' workers, in ms (an idle host's workers still
        report their last busy spell's)."""
        reports = [
            report
            for host, mode in zip(self.hosts, busy, strict=True)
            if mode == "busy"
            for report in host.stats()
        ]
        return 1000 * max((float(report.get("p99", 0.0)) for report in reports), default=0.0)

    def errors(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for host in self.hosts:
            for name, count in host.errors().items():
                found[name] = found.get(name, 0) + count
        return found


def phase(variant: Variant, db: str, busy: tuple[str, ...], warmup: float, seconds: float
          ) -> tuple[float, float, int]:  # fmt: skip
    """Requests per second, p99 in ms and peak connections of one phase."""
    with ServerConnections(db, variant.tag) as witness:
        variant.modes(*busy)
        time.sleep(warmup)
        before, started = variant.successes(), time.monotonic()
        time.sleep(seconds)
        done, ended = variant.successes(), time.monotonic()
        p99 = variant.p99_ms(busy)
        variant.modes("idle", "idle", "idle")
    return (done - before) / (ended - started), p99, witness.highest


def coordinator_xacts(db: str) -> int:
    """Transactions committed and rolled back on the coordinator's database so far."""
    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'coord'"
        ).fetchone()
    return int(row[0]) if row else 0


def coordinator_rate(db: str, variant: Variant, schedule: Sequence[tuple[str, ...]], seconds: float
                     ) -> float:  # fmt: skip
    """Coordinator transactions per second per host while ``schedule`` plays, one step a
    second, for ``seconds``."""
    time.sleep(1.5)  # let the counts of the phase before be flushed
    before, started = coordinator_xacts(db), time.monotonic()
    step = 0
    while time.monotonic() - started < seconds:
        variant.modes(*schedule[step % len(schedule)])
        step += 1
        time.sleep(1.0)
    variant.modes("idle", "idle", "idle")
    time.sleep(1.5)  # the counts of the window flushed (about once a second)
    elapsed = time.monotonic() - started - 1.5
    return (coordinator_xacts(db) - before) / elapsed / len(variant.hosts)


@contextlib.contextmanager
def server() -> Iterator[TempPostgres]:
    started = TempPostgres.start(*DURABLE_POSTGRES)
    try:
        with psycopg.connect(started.url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE coord")
        yield started
    finally:
        started.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=2.5)
    parser.add_argument("--statement", default="SELECT pg_sleep(0.02)")
    args = parser.parse_args()
    with server() as pg:
        db = pg.url
        coord = db.rsplit("/", 1)[0] + "/coord"
        budget = {"url": coord, "name": "bench-db", "total": 6}
        variants: list[Variant] = []
        try:
            variants.append(Variant("budget", db, budget, 4, args.statement))
            variants.append(Variant("static", db, None, 2, args.statement))
            for variant in variants:
                for host in variant.hosts:
                    host.wait_ready()
            loads = {"even": ("busy", "busy", "busy"), "skewed": ("busy", "idle", "idle")}
            results: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
            for _ in range(args.rounds):
                for load, busy in loads.items():
                    for variant in variants:
                        time.sleep(0.5)
                        measured = phase(variant, db, busy, args.warmup, args.seconds)
                        results.setdefault((variant.name, load), []).append(measured)
            print(f"{args.rounds} rounds, {args.seconds:g} s each after {args.warmup:g} s, "
                  f"interleaved; 3 hosts x 4 workers; {args.statement!r}")  # fmt: skip
            print(f"{'load':<7} {'variant':<8} {'req/s':>8} {'p99 ms':>8} {'peak conns':>10}")
            for load in loads:
                rates = {}
                for variant in variants:
                    runs = results[(variant.name, load)]
                    rate = sum(run[0] for run in runs) / len(runs)
                    rates[variant.name] = rate
                    p99 = max(run[1] for run in runs)
                    peak = max(run[2] for run in runs)
                    print(f"{load:<7} {variant.name:<8} {rate:>8.1f} {p99:>8.1f} {peak:>10}")
                ratio = rates["budget"] / rates["static"]
                target = EVEN_TARGET if load == "even" else SKEWED_TARGET
                verdict = "ok" if ratio >= target else "MISSES"
                print(f"{load:<7} budget / static {ratio:.2f}x (target {target:g}x: {verdict})")
            churn = [("busy", "idle", "idle"), ("idle", "busy", "idle"), ("idle", "idle", "busy")]
            schedules = {
                "steady": [("busy", "busy", "busy")],
                "churn": churn,
                "idle": [("idle", "idle", "idle")],
            }
            print("coordinator transactions per second per host (budget ttl 10 s, hand-over 2 s)")
            for label, schedule in schedules.items():
                rate = coordinator_rate(db, variants[0], schedule, 2 * args.seconds)
                print(f"  {label:<7} {rate:>6.2f}")
            for variant in variants:
                assert not variant.errors(), f"{variant.name}: {variant.errors()}"
        finally:
            for variant in variants:
                for host in variant.hosts:
                    host.stop()


if __name__ == "__main__":
    main()
