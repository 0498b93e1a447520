"""``orbit demo``: worker processes contend for keyed leases on a real fleet.

The workers guard a shared resource that enforces fencing: a server thread in
the demo process keeps one :class:`~orbitive.lock.Fence` per key and rejects a
write whose token is older than one it already admitted. Workers acquire,
write, sometimes renew, release, and sometimes overrun their TTL on purpose so
that a successor takes over and the stale write is rejected. An observer
process follows transitions through the lock table's readiness descriptor.

Verdict: every worker reports each tenure as ``[acquired_ms, end_ms)`` where
``end_ms`` is the lease's deadline or the moment just *before* a successful
release (so the interval is never longer than the real tenure); no two
tenures of one key may overlap, and fencing tokens must grow with acquisition
time. Any breach exits with status 1.
"""

from __future__ import annotations

import argparse
import itertools
import math
import multiprocessing
import os
import random
import selectors
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection, Listener
from multiprocessing.queues import Queue
from pathlib import Path
from tempfile import TemporaryDirectory

from .. import Fleet
from ..lock import Acquired, Fence, LockKey, LockOwner, LockTable
from . import _children
from ._demo_pool import run_pool_demo
from ._lock_commands import clear_stopped_fleet

NAMESPACE = "orbit.demo"
KEYS = 4
TTL_S = 0.05
OVERRUN_PROBABILITY = 0.05


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``orbit demo`` to ``orbit``."""
    cmd = subparsers.add_parser(
        "demo", help="run worker processes contending for leases and sharing pooled connections"
    )
    cmd.add_argument(
        "--workers",
        type=_positive_int,
        default=8,
        help="worker processes (8); the pool scenario allows max_live = workers // 2 connections",
    )
    cmd.add_argument(
        "--seconds", type=_positive_float, default=5.0, help="run time of each scenario (5)"
    )
    cmd.add_argument(
        "--scenario",
        choices=("all", "lock", "pool"),
        default="all",
        help="keyed leases, the resource pool, or both in turn (all)",
    )
    cmd.set_defaults(func=cmd_demo)


def _positive_int(text: str) -> int:
    if not text.strip().isdecimal() or not 1 <= int(text) <= 256:
        raise argparse.ArgumentTypeError(f"must be a whole number in 1..256, got {text!r}")
    return int(text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value <= 3600.0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds in (0, 3600], got {text!r}")
    return value


@dataclass
class WorkerReport:
    """What one worker did, sent back to the demo process."""

    acquisitions: int = 0
    conflicts: int = 0
    renewals: int = 0
    lost_renewals: int = 0
    releases: int = 0
    lost_releases: int = 0
    writes_admitted: int = 0
    stale_writes_rejected: int = 0
    ops: int = 0
    #: (key label, fencing token, acquired_ms, end_ms)
    tenures: list[tuple[str, int, int, int]] = field(default_factory=list)


# -- the fenced resource -----------------------------------------------------------


def _serve_resource(listener: Listener, fences: dict[str, Fence]) -> None:
    while True:
        try:
            conn = listener.accept()
        except OSError:
            return
        threading.Thread(target=_serve_client, args=(conn, fences), daemon=True).start()


def _serve_client(conn: Connection, fences: dict[str, Fence]) -> None:
    with conn:
        while True:
            try:
                label, token = conn.recv()
            except (EOFError, OSError):
                return
            conn.send(fences[label].admit(token))


# -- workers -----------------------------------------------------------------------


def _worker(fleet_name: str, capacity: int, address: str, seconds: float, out: Queue) -> None:  # type: ignore[type-arg]
    fleet = Fleet.join(fleet_name, capacity)
    table = LockTable(fleet)
    resource = Client(address)
    owner = LockOwner(f"worker-{fleet.node}-{os.getpid()}")
    report = WorkerReport()
    rng = random.Random()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        label = f"resource-{rng.randrange(KEYS)}"
        result = table.try_acquire(LockKey(NAMESPACE, label), owner, TTL_S)
        report.ops += 1
        if not isinstance(result, Acquired):
            report.conflicts += 1
            time.sleep(rng.uniform(0.0, 0.002))
            continue
        _hold(table, result.lease.key, result, resource, report, rng)
    resource.close()
    out.put(report)
    table.close()
    fleet.close()


def _write(resource: Connection, label: str, token: int, report: WorkerReport) -> None:
    resource.send((label, token))
    if resource.recv():
        report.writes_admitted += 1
    else:
        report.stale_writes_rejected += 1


def _hold(
    table: LockTable,
    key: LockKey,
    result: Acquired,
    resource: Connection,
    report: WorkerReport,
    rng: random.Random,
) -> None:
    lease = result.lease
    label = key.label.decode()
    report.acquisitions += 1
    acquired_ms = round(lease.acquired_at * 1000)
    _write(resource, label, lease.fencing_token, report)
    if rng.random() < OVERRUN_PROBABILITY:
        time.sleep(TTL_S * 3)  # overrun on purpose: a successor may take over
    else:
        time.sleep(rng.uniform(0.0, TTL_S / 4))
        renewed = table.renew(lease, TTL_S)
        report.ops += 1
        if renewed is None:
            report.lost_renewals += 1
        else:
            report.renewals += 1
            lease = renewed
    _write(resource, label, lease.fencing_token, report)
    before_ms = int(time.monotonic() * 1000)
    released = table.release(lease)
    report.ops += 1
    if released:
        report.releases += 1
        end_ms = min(before_ms, round(lease.expires_at * 1000))
    else:
        report.lost_releases += 1
        end_ms = round(lease.expires_at * 1000)
    report.tenures.append((label, lease.fencing_token, acquired_ms, end_ms))


def _observer(fleet_name: str, capacity: int, stop: Connection, out: Queue) -> None:  # type: ignore[type-arg]
    fleet = Fleet.join(fleet_name, capacity)
    table = LockTable(fleet)
    counts: Counter[str] = Counter()
    with selectors.DefaultSelector() as selector:
        selector.register(table.fileno(), selectors.EVENT_READ)
        selector.register(stop, selectors.EVENT_READ)
        done = False
        while not done:
            for ready, _ in selector.select(1.0):
                done = done or ready.fileobj is stop
            table.drain()
            result = table.poll()
            counts.update(event.transition for event in result.events)
            counts["lost"] += result.overwritten + result.unavailable + result.malformed
    out.put(dict(counts))
    table.close()
    fleet.close()


# -- verdict -----------------------------------------------------------------------


def find_overlaps(tenures: list[tuple[str, int, int, int]]) -> list[str]:
    """Breaches: overlapping tenures of one key, or tokens not growing with time."""
    problems = []
    by_key: dict[str, list[tuple[int, int, int]]] = {}
    for label, token, start, end in tenures:
        by_key.setdefault(label, []).append((start, end, token))
    for label, spans in by_key.items():
        spans.sort()
        for (_, end, token), (next_start, _, next_token) in itertools.pairwise(spans):
            if next_start < end:
                problems.append(
                    f"{label}: token {next_token} acquired at {next_start} ms while token "
                    f"{token} held it until {end} ms"
                )
            if next_token <= token:
                problems.append(f"{label}: token {next_token} followed {token}")
    return problems


def cmd_demo(args: argparse.Namespace) -> int:
    """Run the lock scenario, the pool scenario, or both; non-zero if any verdict failed."""
    status = 0
    if args.scenario in ("all", "lock"):
        status |= _lock_demo(args)
    if args.scenario in ("all", "pool"):
        if args.scenario == "all":
            print()
        status |= run_pool_demo(args.workers, args.seconds)
    return status


def _lock_demo(args: argparse.Namespace) -> int:
    fleet_name = f"demo-{os.getpid()}"
    capacity = args.workers + 2
    print(
        f"orbit demo, keyed leases: {args.workers} workers, {args.seconds:g} s, "
        f"fleet {fleet_name!r}",
        flush=True,
    )
    try:
        with TemporaryDirectory(prefix="orbit-demo-") as tmp:
            return _run(fleet_name, capacity, args, str(Path(tmp) / "resource.sock"))
    finally:  # also when interrupted, or when the reader of its output went away
        clear_stopped_fleet(fleet_name)


def _run(fleet_name: str, capacity: int, args: argparse.Namespace, address: str) -> int:
    ctx = multiprocessing.get_context("spawn")
    fences = {f"resource-{n}": Fence() for n in range(KEYS)}
    with (
        Listener(address, family="AF_UNIX") as listener,
        Fleet.join(fleet_name, capacity) as keeper,
        LockTable(keeper),
    ):
        threading.Thread(target=_serve_resource, args=(listener, fences), daemon=True).start()
        out: Queue = ctx.Queue()  # type: ignore[type-arg]
        stop_recv, stop_send = ctx.Pipe(duplex=False)
        observer = ctx.Process(target=_observer, args=(fleet_name, capacity, stop_recv, out))
        workers = [
            ctx.Process(target=_worker, args=(fleet_name, capacity, address, args.seconds, out))
            for _ in range(args.workers)
        ]
        processes = [observer, *workers]
        try:
            for process in processes:
                _children.start(process)
            results = [out.get(timeout=args.seconds + 60) for _ in workers]
            stop_send.send(None)
            observed = out.get(timeout=30)
        except BaseException:
            _children.end(processes, 0.0)  # interrupted: the children stop now
            raise
        finally:
            _children.end(processes, 10.0)
    return _summarise(results, observed, args.seconds)


def _summarise(results: list[WorkerReport], observed: dict[str, int], seconds: float) -> int:
    total = WorkerReport()
    for report in results:
        for name in (
            "acquisitions",
            "conflicts",
            "renewals",
            "lost_renewals",
            "releases",
            "lost_releases",
            "writes_admitted",
            "stale_writes_rejected",
            "ops",
        ):
            setattr(total, name, getattr(total, name) + getattr(report, name))
        total.tenures.extend(report.tenures)
    problems = find_overlaps(total.tenures)
    transitions = sum(v for k, v in observed.items() if k != "lost")
    print(f"  acquisitions           {total.acquisitions:>10,}")
    print(f"  conflicts (Occupied)   {total.conflicts:>10,}")
    print(f"  renewals               {total.renewals:>10,}  (lost: {total.lost_renewals:,})")
    print(f"  releases               {total.releases:>10,}  (lapsed: {total.lost_releases:,})")
    print(f"  writes admitted        {total.writes_admitted:>10,}")
    print(f"  stale writes rejected  {total.stale_writes_rejected:>10,}")
    print(f"  transitions observed   {transitions:>10,}  (ring loss: {observed.get('lost', 0):,})")
    print(f"  lock ops/s             {total.ops / seconds:>10,.0f}")
    if problems:
        print(f"verdict: FAILED, {len(problems)} breach(es):")
        for problem in problems[:20]:
            print(f"  {problem}")
        return 1
    print(f"verdict: OK, {len(total.tenures):,} tenures, no two holders of a key overlapped")
    return 0
