"""Readiness micro-benchmark: cross-process publish-to-readable latency, and bump() cost.

Run: ``python bench/readiness_wake.py [--rounds 2000]``

Latency: a forked child stamps ``time.monotonic_ns()`` (CLOCK_MONOTONIC, one clock
for every process on the host) into the region, then publishes on the channel
inside the region's critical section; the parent, blocked in ``select`` on its
Readiness descriptor, stamps again when it wakes.

Cost: a publish (``Channel.bump``) alone and inside ``Region.acquire()/release()``
with nothing armed, beside a bare ``wake_word`` of the word backend.
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
from orbitive._core._readiness import BACKENDS, Backend, Channel, Readiness
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


def _publisher(region: Region, commands: Connection) -> None:
    channel = Channel(region, WORD, PARKED, CAPACITY)
    while commands.recv():
        region.acquire()
        try:
            _U64.pack_into(region.buf, STAMP, time.monotonic_ns())
            channel.bump()
        finally:
            region.release()
    os._exit(0)


def latency_us(fleet: Fleet, region: Region, rounds: int) -> list[float]:
    """Publish-to-readable latencies, in microseconds."""
    parent_end, child_end = multiprocessing.Pipe()
    context = multiprocessing.get_context("fork")
    child = context.Process(target=_publisher, args=(region, child_end))
    child.start()
    readiness = Readiness(Channel(region, WORD, PARKED, CAPACITY), fleet.node, "bench-readiness")
    samples = []
    with selectors.DefaultSelector() as selector:
        selector.register(readiness.fileno(), selectors.EVENT_READ)
        for _ in range(rounds):
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
    """Microseconds per call of a publish (nothing armed), a publish in the lock, wake_word."""
    buf = region.buf
    channel = Channel(region, WORD, PARKED, CAPACITY)

    def bump_locked() -> None:
        region.acquire()
        try:
            channel.bump()
        finally:
            region.release()

    calls = {
        "publish, nothing armed": channel.bump,
        "acquire + publish + release": bump_locked,
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
        samples = latency_us(fleet, region, args.rounds)
        print(
            f"socket publish->readable: p50 {statistics.median(samples):8.1f} us"
            f"  p99 {percentile(samples, 0.99):8.1f} us  ({len(samples)} rounds)"
        )
        for backend in backends:
            for label, cost in costs_us(region, backend, args.calls).items():
                print(f"{backend.NAME:5} {label:27} {cost:6.2f} us")
    finally:
        remove_region(fleet, region)


if __name__ == "__main__":
    main()
