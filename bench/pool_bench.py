"""Pool speed: local reuse cycle, remote reuse over a session, acquire under 8 processes,
and wake latency from a completion to a parked waiter in another process.

Run: ``.venv/bin/python bench/pool_bench.py`` (targets: local cycle median <= 15 us,
remote >= 20,000 round trips/s, wake p50 <= 200 us).
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import socket
import statistics
import sys
import time
from multiprocessing.connection import Connection

from orbitive import Fleet
from orbitive.cli import main as orbit
from orbitive.pool import Key, LocalFirst, LocalReuse, Pool, ResourceId
from orbitive.pool.session import SessionClosed, accept_session, open_session

try:
    from bench.placement import placed
except ModuleNotFoundError:  # run as a script: bench/ is on sys.path, not its parent
    from placement import placed  # type: ignore[import-not-found,no-redef]

KEY = Key.digest(b"bench")
CAPACITY = 10
PAYLOAD = bytes(range(128))
CONTEXT = multiprocessing.get_context("spawn")


def local_cycle(fleet_name: str) -> None:
    """Median of reserve + accept + complete on our own resource, one process."""
    with Fleet.join(fleet_name, CAPACITY) as fleet, Pool(fleet) as pool:
        rid = pool.register(KEY, 1)
        reserve, accept = pool.reserve, pool.accept
        for _ in range(5_000):
            accept(reserve(rid)).complete()
        batches = []
        for _ in range(15):
            started = time.perf_counter_ns()
            for _ in range(10_000):
                accept(reserve(rid)).complete()
            batches.append((time.perf_counter_ns() - started) / 10_000 / 1000)
        pool.unregister(rid)
    print(f"local reuse cycle       median {statistics.median(batches):6.2f} us "
          f"(min {min(batches):.2f}, 15 x 10,000; target <= 15 us)")  # fmt: skip


def _owner(fleet_name: str, path: str, ready: Connection) -> None:
    with Fleet.join(fleet_name, CAPACITY) as fleet, Pool(fleet) as pool:
        rid = pool.register(KEY, 1)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        ready.send(rid)
        conn, _ = listener.accept()
        listener.close()
        os.unlink(path)  # connected: the next run binds the same path
        with conn:
            while True:
                try:
                    execution = accept_session(pool, conn)
                except SessionClosed:  # the borrower hung up: done
                    break
                with execution:  # the work is done once the reply is computed
                    reply = conn.recv(len(PAYLOAD), socket.MSG_WAITALL)
                conn.sendall(reply)
        pool.unregister(rid)


def remote_reuse(fleet_name: str, path: str, one_cpu: bool, count: int = 30_000) -> None:
    """Round trips/s: reserve, session frame + 128 B, owner accepts, echoes, completes.

    ``one_cpu``: both processes on one CPU (see ``placement.py``).
    """
    with placed(one_cpu):
        _remote_reuse(fleet_name, path, count, ", one CPU" if one_cpu else "")


def _remote_reuse(fleet_name: str, path: str, count: int, label: str) -> None:
    parent, child = CONTEXT.Pipe()
    owner = CONTEXT.Process(target=_owner, args=(fleet_name, path, child))
    owner.start()
    if not parent.poll(60):
        raise RuntimeError("the owner process did not start")
    rid: ResourceId = parent.recv()
    with Fleet.join(fleet_name, CAPACITY) as fleet, Pool(fleet) as pool:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        latencies = []
        started = time.perf_counter()
        for _ in range(count):
            begin = time.perf_counter_ns()
            lease = pool.reserve(rid)
            open_session(lease, sock, PAYLOAD)
            if sock.recv(len(PAYLOAD), socket.MSG_WAITALL) != PAYLOAD:
                raise RuntimeError("the owner stopped echoing")
            latencies.append(time.perf_counter_ns() - begin)
        elapsed = time.perf_counter() - started
        sock.close()
    owner.join()
    latencies.sort()
    print(
        f"remote reuse (session)  {count / elapsed:9,.0f} round trips/s, p50 "
        f"{latencies[len(latencies) // 2] / 1000:.1f} us, p99 "
        f"{latencies[len(latencies) * 99 // 100] / 1000:.1f} us (128 B{label}; "
        "target >= 20,000/s)"
    )


def _acquirer(fleet_name: str, count: int, out: Connection) -> None:
    with Fleet.join(fleet_name, CAPACITY) as fleet, Pool(fleet) as pool:
        pool.register(KEY, 1)
        policy = LocalFirst()
        out.send("ready")
        out.recv()
        started = time.perf_counter()
        local = 0
        for _ in range(count):
            plan = pool.acquire(KEY, policy=policy)
            if isinstance(plan, LocalReuse):
                pool.accept(plan.lease).complete()
                local += 1
        out.send((time.perf_counter() - started, local))


def acquire_contended(fleet_name: str, processes: int = 8, count: int = 5_000) -> None:
    """acquire (LocalFirst) + accept + complete in 8 processes, one shared table."""
    pipes = [CONTEXT.Pipe() for _ in range(processes)]
    workers = [
        CONTEXT.Process(target=_acquirer, args=(fleet_name, count, child)) for _, child in pipes
    ]
    for worker in workers:
        worker.start()
    for parent, _ in pipes:
        parent.recv()
    started = time.perf_counter()
    for parent, _ in pipes:
        parent.send("go")
    results = [parent.recv() for parent, _ in pipes]
    wall = time.perf_counter() - started
    for worker in workers:
        worker.join()
    per_op = statistics.median(seconds / count * 1e6 for seconds, _ in results)
    print(f"acquire, {processes} processes     {processes * count / wall:9,.0f} ops/s total, "
          f"median {per_op:.1f} us per op per process ({os.cpu_count()} CPUs)")  # fmt: skip


def _waiter(fleet_name: str, rounds: int, out: Connection) -> None:
    with Fleet.join(fleet_name, CAPACITY) as fleet, Pool(fleet) as pool:
        for _ in range(rounds):
            since = pool.version(KEY)
            out.send(since)
            pool.wait_capacity(KEY, since, timeout=5.0)
            out.send(time.monotonic_ns())


def wake_latency(fleet_name: str, rounds: int = 300) -> None:
    """From a completion here to a waiter parked in another process returning."""
    with Fleet.join(fleet_name, CAPACITY) as fleet, Pool(fleet) as pool:
        rid = pool.register(KEY, 1)
        parent, child = CONTEXT.Pipe()
        waiter = CONTEXT.Process(target=_waiter, args=(fleet_name, rounds, child))
        waiter.start()
        latencies = []
        for _ in range(rounds):
            execution = pool.accept(pool.reserve(rid))
            parent.recv()
            time.sleep(0.002)  # let it park
            completed = time.monotonic_ns()
            execution.complete()
            latencies.append(parent.recv() - completed)
        waiter.join()
    latencies.sort()
    print(f"wake latency            p50 {latencies[len(latencies) // 2] / 1000:6.1f} us, "
          f"p99 {latencies[len(latencies) * 99 // 100] / 1000:.1f} us "
          f"({rounds} wakes, other process; target p50 <= 200 us)")  # fmt: skip


def main() -> int:
    """Run every benchmark on fresh fleets and unlink them afterwards."""
    base = f"bench-{os.getpid()}"
    names = [f"{base}-{i}" for i in range(4)]
    path = f"/tmp/orbit-bench-{os.getpid()}.sock"
    try:
        local_cycle(names[0])
        remote_reuse(names[1], path, one_cpu=False)
        remote_reuse(names[1], path, one_cpu=True)
        acquire_contended(names[2])
        wake_latency(names[3])
    finally:
        for name in names:
            with Fleet.join(name, CAPACITY) as fleet, Pool(fleet) as pool:
                pool.unlink()
            with contextlib.redirect_stdout(io.StringIO()):  # "removed 0 object(s)": noise
                orbit(["clear", name, "--all", "--yes"])  # the fleet's lock files too
        if os.path.exists(path):
            os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
