"""One budget across hosts against session advisory-lock slots and static per-host caps,
and what each costs the coordinator (issue 23).

Run: ``.venv/bin/python bench/budget_bench.py [--rounds N] [--seconds S] [--warmup S]
[--statement SQL] [--checkouts N] [--pairs N] [--slice S]`` (as root: each host gets
a private ``/dev/shm``).

First, what **one checkout costs when a unit must be taken**, in round trips
counted by a TCP proxy (``bench/_round_trips.py``) in front of the coordinator
and of the capped server, and in ms, by a pool in this process: budget (the
host holds no unit: the steward takes one, then the connection is opened),
slots (open, then take a slot), and a plain connect.

Then nine simulated hosts (``tests/clients/_budget_hosts.py``) of four worker
processes each run against one throw-away durable PostgreSQL server, each
worker sending one request after another (default ``SELECT pg_sleep(0.02)``):

* **budget**: three hosts with ``max_live=4`` sharing ``Budget(total=6)``, whose
  coordinator is the same server (database ``coord``, so its statements can be
  counted apart);
* **slots**: three hosts with ``max_live=4`` whose connections each hold one of
  six session advisory locks (``bench/_slot_connection.py``: a creation opens a
  session, tries the six slots in one statement, and closes it and polls again
  every 50 ms when none is free), with ``idle_timeout`` set to the budget's
  ``handover_within`` (2 s), the only way an idle host lets its slots go;
* **static**: three hosts with ``max_live=2`` each and neither, PgBouncer's way
  (a fixed share of the same six connections per host).

Each round runs, interleaved (so all three see the same machine load), the
**even** load (all three hosts busy) and the **skewed** one (host ``a`` busy,
the other two idle, holding what they held), one variant after the other. A
phase turns its hosts busy, waits ``--warmup`` seconds (default 4: twice
``handover_within``, so the even load that follows a skewed one is counted once
host ``a`` has handed its units over, in its steady state), then counts for
``--seconds``:

* requests per second, and p99 latency (the highest of the busy workers' p99s
  over the whole busy spell, warm-up included);
* peak connections of the variant in ``pg_stat_activity``, sampled every 5 ms
  (a refused slot session lives a few ms, so this is a lower bound of its
  momentary overshoot);
* sessions opened per second on the capped database (``pg_stat_database.sessions``):
  a budget host's reconnects as units move, a slot host's refused connects;
* units the budget hosts gave back (their census every 0.1 s: hand-overs), in the
  warm-up and per second in the window;
* busy workers that completed no request in the window (starved);
* CPU ms per request of the server (its postmaster, the backends it reaped and
  those alive) and of every process of the variant's hosts (``/proc``);
* coordination statements per second: the budget's transactions on ``coord``
  (``pg_stat_database``; each coordinator call is one transaction); for slots,
  one ``pg_try_advisory_lock`` statement per session opened.

The server flushes those counts about once a second, so both reads of a window
come 1.1 s after its ends while the hosts keep the phase's mode. Then each
round's ratio to static; the median and range over the rounds (with the load
average at each round).

Then the **even load in its steady state**, budget against static: each warmed
up busy for twice ``handover_within``, then ``--pairs`` pairs of ``--slice``
second slices, one variant's then the other's (the order alternating), each
counted after 0.5 s; the median, quartiles and range of the pairs' ratios.
Between its slices a budget host keeps its units and idle clients (nobody
waits), so each slice starts where the last ended, hand-overs done.

Then the **coordinator's cost** of the budget: transactions per second per host
on ``coord``, with the budget hosts steady (all busy), churning (the busy host
changes every second, so units move) and idle.

Targets (issue 23): skewed, the budget wins by the ratio demand allows (4 / 2 =
2x here: host ``a`` may use ``max_live=4`` of the total, a static host 2; the
verdict allows 5 % less); even, at least 0.95x.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench._round_trips import RoundTripProxy
from bench._slot_connection import TOTAL, SlotConnection
from orbitive import Fleet
from orbitive.clients import Budget, PoolOptions
from orbitive.clients.psycopg import ConnectionPool
from tests._servers import DURABLE_POSTGRES, TempPostgres
from tests.clients._budget_hosts import HANDOVER, Host
from tests.clients._sampling import ServerConnections

#: Targets of issue 23: the budget's throughput over the static caps'.
EVEN_TARGET = 0.95
SKEWED_TARGET = 1.9  # the 2x that demand allows here, less 5 %
#: Seconds the server may take to flush a backend's counts.
FLUSH_S = 1.1
#: Seconds a steady-state slice runs before it is counted.
LEAD_S = 0.5
#: Seconds between two looks at the budget hosts' units.
SAMPLE_S = 0.1
LOADS = {"even": ("busy", "busy", "busy"), "skewed": ("busy", "idle", "idle")}


class Variant:
    """Three hosts of one kind and the tag of their connections."""

    def __init__(self, name: str, db: str, statement: str, max_live: int, *,
                 budget: dict[str, object] | None = None, connection_class: str | None = None,
                 idle_timeout: float | None = None) -> None:  # fmt: skip
        self.name, self.tag = name, f"bench-{name}-{secrets.token_hex(3)}"
        options: dict[str, object] = {"max_live": max_live}
        if idle_timeout is not None:
            options["idle_timeout"] = idle_timeout
        self.hosts = [
            Host(f"{name}-{host}", db=db, budget=budget, options=options, tag=self.tag,
                 statement=statement, timeout=60.0, connection_class=connection_class)
            for host in "abc"
        ]  # fmt: skip

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

    def done(self, busy: tuple[str, ...]) -> list[int]:
        """Requests each worker of the busy hosts completed so far (every worker reports
        once its host is ready)."""
        return [
            int(report.get("ok", 0))
            for host, mode in zip(self.hosts, busy, strict=True)
            if mode == "busy"
            for report in host.stats()
        ]

    def errors(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for host in self.hosts:
            for name, count in host.errors().items():
                found[name] = found.get(name, 0) + count
        return found


@dataclass
class Phase:
    """What one phase of one variant measured."""

    rate: float  # requests per second
    p99_ms: float
    peak: int  # connections in pg_stat_activity
    connects: float  # sessions opened per second on the capped database
    coordination: float  # the budget's coordinator transactions (slots: lock statements) per s
    handed: int  # units the budget hosts gave back in the warm-up, seen every SAMPLE_S
    gives: float  # units the budget hosts gave back per second in the window, the same
    starved: int  # busy workers that completed no request in the window
    cpu_ms: float  # CPU ms of the server and the variant's hosts per request


def units_given(variant: Variant, seconds: float) -> int:
    """Units the variant's hosts gave back over ``seconds``, as their census shows them
    every :data:`SAMPLE_S` (0 for hosts without a budget)."""
    given = 0
    last: list[int | None] = [None] * len(variant.hosts)
    deadline = time.monotonic() + seconds
    while True:
        for index, host in enumerate(variant.hosts):
            found = host.census().get("budget_units")
            if isinstance(found, (int, float)):
                units, seen = int(found), last[index]
                given += max(0, seen - units) if seen is not None else 0
                last[index] = units
        if time.monotonic() >= deadline:
            return given
        time.sleep(SAMPLE_S)


def cpu_seconds(pid: int, children: bool = False) -> float:
    """CPU seconds ``pid`` used (``children``: with its children reaped so far); 0 once
    it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    if children:
        ticks += int(fields[13]) + int(fields[14])  # cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def server_cpu(postmaster: int) -> float:
    """CPU seconds of the server: its postmaster, every backend it reaped, and those alive."""
    alive = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdecimal():
            with contextlib.suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                    alive += cpu_seconds(int(entry.name))
    return cpu_seconds(postmaster, children=True) + alive


class Counters:
    """The server's cumulative counts, read over a connection to a database of its own."""

    def __init__(self, url: str, postmaster: int) -> None:
        self._conn = psycopg.connect(url.rsplit("/", 1)[0] + "/watch", autocommit=True)
        self._postmaster = postmaster

    def cpu(self, variant: Variant) -> float:
        """CPU seconds the server and the variant's hosts (every process) used so far."""
        hosts = sum(
            cpu_seconds(int(pid), children=True)
            for host in variant.hosts
            for pid in json.loads((host.folder / "pids.json").read_text())
        )
        return hosts + server_cpu(self._postmaster)

    def read(self) -> tuple[int, int]:
        """(sessions opened on ``postgres``, transactions on ``coord``) so far."""
        rows: dict[str, int] = dict(self._conn.execute(
            "SELECT datname, CASE WHEN datname = 'coord' THEN xact_commit + xact_rollback "
            "ELSE sessions END FROM pg_stat_database WHERE datname IN ('postgres', 'coord')"
        ).fetchall())  # fmt: skip
        return int(rows.get("postgres", 0)), int(rows.get("coord", 0))

    def close(self) -> None:
        self._conn.close()


def phase(variant: Variant, db: str, counters: Counters, busy: tuple[str, ...], warmup: float,
          seconds: float) -> Phase:  # fmt: skip
    """Measure one phase of ``variant`` (see the module)."""
    with ServerConnections(db, variant.tag) as witness:
        variant.modes(*busy)
        handed = units_given(variant, warmup)
        before, started, each = variant.successes(), time.monotonic(), variant.done(busy)
        cpu = counters.cpu(variant)
        gives = units_given(variant, FLUSH_S)
        sessions_0, xacts_0 = counters.read()
        gives += units_given(variant, seconds - FLUSH_S)
        done, ended = variant.successes(), time.monotonic()
        cpu = counters.cpu(variant) - cpu
        starved = sum(1 for was, now in zip(each, variant.done(busy), strict=True) if now == was)
        p99 = variant.p99_ms(busy)
        time.sleep(FLUSH_S)
        sessions_1, xacts_1 = counters.read()
        variant.modes("idle", "idle", "idle")
    elapsed = ended - started
    connects = (sessions_1 - sessions_0) / elapsed
    coordination = connects if variant.name == "slots" else 0.0
    if variant.name == "budget":
        coordination = (xacts_1 - xacts_0) / elapsed
    rate = (done - before) / elapsed
    return Phase(
        rate,
        p99,
        witness.highest,
        connects,
        coordination,
        handed,
        gives / elapsed,
        starved,
        1000 * cpu / max(1, done - before),
    )


def steady_even(variants: list[Variant], pairs: int, slice_s: float) -> list[float]:
    """The even load in its steady state: each variant warmed up busy, then ``pairs``
    times a slice of ``slice_s`` seconds of each in turn (the order alternating), each
    counted after a lead of :data:`LEAD_S`; the ratio of each pair's rates, first over
    second.

    Between its slices a budget host holds its units and its idle clients (no host
    waits), and a static host its connections, so each slice starts where the last
    one ended."""
    for variant in variants:
        variant.modes("busy", "busy", "busy")
        time.sleep(2 * HANDOVER)  # every hand-over of the phases before settled
        variant.modes("idle", "idle", "idle")
    ratios = []
    for number in range(pairs):
        rates = {}
        for variant in variants if number % 2 == 0 else variants[::-1]:
            variant.modes("busy", "busy", "busy")
            time.sleep(LEAD_S)
            before, started = variant.successes(), time.monotonic()
            time.sleep(slice_s)
            rates[variant.name] = (variant.successes() - before) / (time.monotonic() - started)
            variant.modes("idle", "idle", "idle")
            time.sleep(0.2)
        ratios.append(rates[variants[0].name] / rates[variants[1].name])
    return ratios


def coordinator_rate(counters: Counters, variant: Variant,
                     schedule: Sequence[tuple[str, ...]], seconds: float) -> float:  # fmt: skip
    """Coordinator transactions per second per host while ``schedule`` plays, one step a
    second, for ``seconds``."""
    time.sleep(1.5)  # let the counts of the phase before be flushed
    before, started = counters.read()[1], time.monotonic()
    step = 0
    while time.monotonic() - started < seconds:
        variant.modes(*schedule[step % len(schedule)])
        step += 1
        time.sleep(1.0)
    variant.modes("idle", "idle", "idle")
    time.sleep(1.5)  # the counts of the window flushed (about once a second)
    elapsed = time.monotonic() - started - 1.5
    return (counters.read()[1] - before) / elapsed / len(variant.hosts)


def checkout_costs(pg: TempPostgres, coord: str, repeat: int) -> None:
    """Round trips and ms of one checkout that must take a unit, per design (see the module)."""
    print(f"one checkout that must take a unit (median of {repeat}; round trips on its path, "
          "and in the second after it)")  # fmt: skip
    print(f"{'design':<8} {'coord RT':>8} {'server RT':>9} {'ms':>7} {'coord RT 1 s':>12}")
    coord_port = int(coord.rsplit(":", 1)[1].split("/", maxsplit=1)[0])
    with RoundTripProxy(coord_port) as to_coord, RoundTripProxy(pg.port) as to_server:
        db = f"postgresql://postgres@127.0.0.1:{to_server.port}/postgres"
        coord_url = f"postgresql://postgres@127.0.0.1:{to_coord.port}/coord"
        for design in ("budget", "slots", "plain"):
            seen: list[tuple[int, int, float, int]] = []
            for _ in range(repeat):
                fleet = Fleet.join(f"bench-checkout-{secrets.token_hex(4)}", 4)
                budget = None
                if design == "budget":
                    budget = Budget(coord_url, name=f"checkout-{secrets.token_hex(4)}",
                                    total=TOTAL)  # fmt: skip
                with ConnectionPool(
                    db, fleet=fleet, options=PoolOptions(max_live=1), budget=budget,
                    connection_class=SlotConnection if design == "slots" else psycopg.Connection,
                ) as pool:  # fmt: skip
                    time.sleep(1.0)  # the steward's first round done
                    to_coord.reset()
                    to_server.reset()
                    started = time.perf_counter()
                    with pool.connection():
                        took = time.perf_counter() - started
                        coord_rt, server_rt = to_coord.round_trips, to_server.round_trips
                    time.sleep(1.0)
                    seen.append((coord_rt, server_rt, 1000 * took, to_coord.round_trips))
                fleet.close()
            median = [statistics.median(run[i] for run in seen) for i in range(4)]
            print(f"{design:<8} {median[0]:>8g} {median[1]:>9g} {median[2]:>7.1f} "
                  f"{median[3]:>12g}")  # fmt: skip


@contextlib.contextmanager
def server() -> Iterator[TempPostgres]:
    started = TempPostgres.start(*DURABLE_POSTGRES)
    try:
        with psycopg.connect(started.url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE coord")
            conn.execute("CREATE DATABASE watch")
        yield started
    finally:
        started.stop()


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def report(results: dict[tuple[str, str], list[Phase]], names: list[str], rounds: int) -> None:
    """Per load and variant: the median of the rounds (p99, peak and starved workers: the
    highest), then each round's ratios to static."""
    print(f"{'load':<7} {'variant':<7} {'req/s':>7} {'p99 ms':>7} {'peak':>5} {'conn/s':>7} "
          f"{'coord/s':>8} {'handed':>6} {'gives/s':>7} {'starved':>7} {'cpu ms':>6}")  # fmt: skip
    for load in LOADS:
        for name in names:
            runs = results[(name, load)]
            print(f"{load:<7} {name:<7} {statistics.median(r.rate for r in runs):>7.1f} "
                  f"{max(r.p99_ms for r in runs):>7.0f} {max(r.peak for r in runs):>5} "
                  f"{statistics.median(r.connects for r in runs):>7.1f} "
                  f"{statistics.median(r.coordination for r in runs):>8.1f} "
                  f"{statistics.median(r.handed for r in runs):>6g} "
                  f"{statistics.median(r.gives for r in runs):>7.2f} "
                  f"{max(r.starved for r in runs):>7} "
                  f"{statistics.median(r.cpu_ms for r in runs):>6.2f}")  # fmt: skip
    for load in LOADS:
        for name in names[:-1]:
            ratios = [
                mine.rate / static.rate
                for mine, static in zip(results[(name, load)], results[("static", load)],
                                        strict=True)
            ]  # fmt: skip
            target = EVEN_TARGET if load == "even" else SKEWED_TARGET
            median = statistics.median(ratios)
            verdict = "ok" if median >= target else "MISSES"
            cpu = [
                mine.cpu_ms / static.cpu_ms
                for mine, static in zip(results[(name, load)], results[("static", load)],
                                        strict=True)
            ]  # fmt: skip
            print(f"{load:<7} {name} / static: median {median:.2f}x, range "
                  f"{min(ratios):.2f}..{max(ratios):.2f} over {rounds} rounds "
                  f"(target {target:g}x: {verdict}); rounds: "
                  + " ".join(f"{ratio:.2f}" for ratio in ratios)
                  + f"; CPU per request: median {statistics.median(cpu):.2f}x, rounds: "
                  + " ".join(f"{ratio:.2f}" for ratio in cpu))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=2 * HANDOVER)
    parser.add_argument("--statement", default="SELECT pg_sleep(0.02)")
    parser.add_argument("--checkouts", type=int, default=5, help="repeats of the checkout cost")
    parser.add_argument("--pairs", type=int, default=24, help="steady even-load slice pairs")
    parser.add_argument("--slice", type=float, default=2.0, help="seconds of each slice")
    args = parser.parse_args()
    with server() as pg:
        db = pg.url
        coord = db.rsplit("/", 1)[0] + "/coord"
        assert pg.process is not None
        counters = Counters(db, pg.process.pid)
        variants: list[Variant] = []
        try:
            checkout_costs(pg, coord, args.checkouts)
            budget = {"url": coord, "name": "bench-db", "total": TOTAL}
            variants.append(Variant("budget", db, args.statement, 4, budget=budget))
            slots = "bench._slot_connection:SlotConnection"
            variants.append(Variant("slots", db, args.statement, 4, idle_timeout=HANDOVER,
                                    connection_class=slots))  # fmt: skip
            variants.append(Variant("static", db, args.statement, 2))
            for variant in variants:
                for host in variant.hosts:
                    host.wait_ready()
            names = [variant.name for variant in variants]
            results: dict[tuple[str, str], list[Phase]] = {}
            print(f"{args.rounds} rounds, {args.seconds:g} s each after {args.warmup:g} s, "
                  f"interleaved; 3 hosts x 4 workers per variant; {args.statement!r}")  # fmt: skip
            for number in range(args.rounds):
                print(f"round {number + 1}: load average {loadavg()}", flush=True)
                for load, busy in LOADS.items():
                    for variant in variants:
                        time.sleep(0.5)
                        measured = phase(variant, db, counters, busy, args.warmup, args.seconds)
                        results.setdefault((variant.name, load), []).append(measured)
            print(f"load average at the end {loadavg()}")
            report(results, names, args.rounds)
            print(f"steady even load, budget / static, {args.pairs} pairs of {args.slice:g} s "
                  f"slices after {LEAD_S:g} s: load average {loadavg()}")  # fmt: skip
            ratios = steady_even([variants[0], variants[2]], args.pairs, args.slice)
            quartiles = statistics.quantiles(ratios, n=4)
            verdict = "ok" if statistics.median(ratios) >= EVEN_TARGET else "MISSES"
            print(f"  median {statistics.median(ratios):.3f}x, quartiles {quartiles[0]:.3f}.."
                  f"{quartiles[2]:.3f}, range {min(ratios):.2f}..{max(ratios):.2f} (target "
                  f"{EVEN_TARGET:g}x: {verdict}); load average {loadavg()}")  # fmt: skip
            churn = [("busy", "idle", "idle"), ("idle", "busy", "idle"), ("idle", "idle", "busy")]
            schedules = {
                "steady": [("busy", "busy", "busy")],
                "churn": churn,
                "idle": [("idle", "idle", "idle")],
            }
            print("budget coordinator transactions per second per host (ttl 10 s, hand-over 2 s)")
            for label, schedule in schedules.items():
                rate = coordinator_rate(counters, variants[0], schedule, 2 * args.seconds)
                print(f"  {label:<7} {rate:>6.2f}")
            for variant in variants:
                assert not variant.errors(), f"{variant.name}: {variant.errors()}"
        finally:
            for variant in variants:
                for host in variant.hosts:
                    host.stop()
            counters.close()


if __name__ == "__main__":
    main()
