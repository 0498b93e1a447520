"""Readiness micro-benchmark: cross-process publish-to-readable latency, and bump() cost.

Run: ``python bench/readiness_wake.py [--rounds 2000]``

Latency: a forked child stamps ``time.monotonic_ns()`` (CLOCK_MONOTONIC, one clock
for every process on the host) into the region, then bumps the word inside the
region's critical section; the parent, blocked in ``select`` on its Readiness
descriptor, stamps again when it wakes. Before each round the parent waits until
its driver is parked again, so every round measures the sleeping-observer path.

Cost: ``bump()`` alone and inside ``Region.acquire()/release()`` with no parked
node, beside a bare ``wake_word`` (the syscall that the parked bytes let bump skip).
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing
import os
import selectors
import statistics
import struct
import time
import timeit
from multiprocessing.connection import Connection

from orbitive import Fleet
from orbitive._core._readiness import BACKENDS, Backend, Readiness
from orbitive._core._region import SHM_DIR, Region

KIND = 202
SIZE = 4096
CAPACITY = 4
WORD = 8
STAMP = 16
PARKED = 64
_U64 = struct.Struct("<Q")


def _init(buf: mmap.mmap) -> None:
    buf[0:8] = b"rdybench"


def _validate(buf: mmap.mmap) -> None:
    if buf[0:8] != b"rdybench":
        raise ValueError("not a readiness bench region")


def _publisher(region: Region, backend: Backend, commands: Connection) -> None:
    while commands.recv():
        region.acquire()
        try:
            _U64.pack_into(region.buf, STAMP, time.monotonic_ns())
            backend.bump(region.buf, WORD, PARKED, CAPACITY)
        finally:
            region.release()
    os._exit(0)


def _wait_parked(buf: mmap.mmap, index: int) -> None:
    deadline = time.monotonic() + 2.0
    while buf[index] == 0 and time.monotonic() < deadline:
        time.sleep(0.0001)


def latency_us(fleet: Fleet, region: Region, backend: Backend, rounds: int) -> list[float]:
    """Publish-to-readable latencies, in microseconds."""
    parent_end, child_end = multiprocessing.Pipe()
    context = multiprocessing.get_context("fork")
    child = context.Process(target=_publisher, args=(region, backend, child_end))
    child.start()  # before the driver thread exists: fork copies no threads
    readiness = Readiness(
        region.buf, WORD, PARKED, fleet.node, "bench-readiness", lock=region, backend=backend
    )
    samples = []
    with selectors.DefaultSelector() as selector:
        selector.register(readiness.fileno(), selectors.EVENT_READ)
        for _ in range(rounds):
            if backend.PARKED is not None:
                _wait_parked(region.buf, PARKED + fleet.node)
            parent_end.send(True)
            if not selector.select(5.0):
                raise SystemExit("no readiness within 5 s")
            woke = time.monotonic_ns()
            readiness.drain()
            samples.append((woke - _U64.unpack_from(region.buf, STAMP)[0]) / 1000)
    parent_end.send(False)
    child.join()
    readiness.close()
    return samples


def costs_us(region: Region, backend: Backend, number: int) -> dict[str, float]:
    """Microseconds per call of bump (nobody parked), bump in the lock, and wake_word."""
    buf = region.buf

    def bump_locked() -> None:
        region.acquire()
        try:
            backend.bump(buf, WORD, PARKED, CAPACITY)
        finally:
            region.release()

    calls = {
        "bump, nobody parked": lambda: backend.bump(buf, WORD, PARKED, CAPACITY),
        "acquire + bump + release": bump_locked,
        "wake_word, nobody waiting": lambda: backend.wake_word(buf, WORD),
    }
    return {
        label: min(timeit.repeat(call, number=number, repeat=5)) / number * 1e6
        for label, call in calls.items()
    }


def percentile(samples: list[float], fraction: float) -> float:
    """The ``fraction`` (0..1) percentile of ``samples``, nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def open_region() -> tuple[Fleet, Region]:
    """A fresh fleet (named after this process) and its bench region."""
    fleet = Fleet.join(f"rdybench-{os.getpid()}", CAPACITY)
    return fleet, fleet.region(KIND, SIZE, _init, _validate)


def remove_region(fleet: Fleet, region: Region) -> None:
    """Unlink the region, close the fleet and remove its lock files."""
    region.unlink()
    fleet.close()
    remove_fleet_files(fleet.name)


def remove_fleet_files(name: str) -> None:
    """Remove every SHM object of fleet ``name`` (its tables and its membership object)."""
    for path in SHM_DIR.glob(f"orbit-{name}-*"):
        path.unlink(missing_ok=True)


def usable_backends() -> tuple[list[Backend], dict[str, str]]:
    """The backends that run here, and a skip reason for each one that does not."""
    usable, skipped = [], {}
    for backend in BACKENDS.values():
        try:
            backend.probe()
        except OSError as exc:
            skipped[backend.NAME] = str(exc)
            continue
        usable.append(backend)
    return usable, skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000, help="latency rounds per backend")
    parser.add_argument("--calls", type=int, default=100_000, help="calls per cost sample")
    args = parser.parse_args()
    fleet, region = open_region()
    try:
        backends, skipped = usable_backends()
        for name, reason in skipped.items():
            print(f"{name}: skipped ({reason})")
        for backend in backends:
            samples = latency_us(fleet, region, backend, args.rounds)
            print(
                f"{backend.NAME:5} publish->readable: p50 {statistics.median(samples):8.1f} us"
                f"  p99 {percentile(samples, 0.99):8.1f} us  ({len(samples)} rounds)"
            )
            for label, cost in costs_us(region, backend, args.calls).items():
                print(f"{backend.NAME:5} {label:27} {cost:6.2f} us")
    finally:
        remove_region(fleet, region)


if __name__ == "__main__":
    main()
