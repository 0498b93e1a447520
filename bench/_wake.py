"""Cross-process wake latency: orbitive readiness beside a bare pipe (the floor).

The orbitive rows are :func:`bench.readiness_wake.latency_us` for each backend
that runs here (publish inside the region's critical section, observer blocked
in ``select`` on its descriptor). The floor is the least a readable descriptor
can cost: a forked child writes its ``CLOCK_MONOTONIC`` stamp into a pipe the
parent is blocked on, with no shared memory, lock or driver thread.
"""

from __future__ import annotations

import os
import selectors
import struct
import time
from multiprocessing import get_context
from multiprocessing.connection import Connection

from . import readiness_wake
from ._measure import Kind, Result

_STAMP = struct.Struct("<Q")
SECTION = "wake latency"
GROUP = "publish -> readable"


def _pipe_publisher(commands: Connection, write_fd: int) -> None:
    while commands.recv():
        os.write(write_fd, _STAMP.pack(time.monotonic_ns()))
    os._exit(0)


def pipe_latency_us(rounds: int) -> list[float]:
    """Pipe write -> select readable -> read latencies, in microseconds."""
    read_fd, write_fd = os.pipe()
    parent_end, child_end = get_context("fork").Pipe()
    child = get_context("fork").Process(target=_pipe_publisher, args=(child_end, write_fd))
    child.start()
    samples = []
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(read_fd, selectors.EVENT_READ)
            for _ in range(rounds):
                time.sleep(0.0002)  # let the parent block, as the readiness rounds do
                parent_end.send(True)
                if not selector.select(5.0):
                    raise RuntimeError("no pipe wake within 5 s")
                woke = time.monotonic_ns()
                sent = _STAMP.unpack(os.read(read_fd, _STAMP.size))[0]
                samples.append((woke - sent) / 1000)
    finally:
        parent_end.send(False)
        child.join()
        os.close(read_fd)
        os.close(write_fd)
    return samples


def wake_results(rounds: int, repeats: int) -> list[Result]:
    """One Result per readiness backend (skipped ones with the reason) and the pipe floor.

    Each of ``repeats`` runs takes ``rounds`` wakes; a sample is one run's p50 and
    ``extra["p99_us"]`` is the p99 over every wake of every run.
    """
    results = []
    fleet, region = readiness_wake.open_region()
    try:
        runs = [readiness_wake.latency_us(fleet, region, rounds) for _ in range(repeats)]
        results.append(_result("orbitive readiness (socket)", "orbitive", runs))
    finally:
        readiness_wake.remove_region(fleet, region)
    runs = [pipe_latency_us(rounds) for _ in range(repeats)]
    results.append(_result("os.pipe write -> select", "floor", runs))
    return results


def latency(result: Result, runs: list[list[float]]) -> Result:
    """Fill ``result``: each sample is one run's p50; ``extra["p99_us"]`` is over every run."""
    every = [sample for run in runs for sample in run]
    result.samples = [readiness_wake.percentile(run, 0.5) for run in runs]
    result.extra = {"p99_us": readiness_wake.percentile(every, 0.99), "wakes": len(every)}
    return result


def _result(name: str, kind: Kind, runs: list[list[float]], skipped: str | None = None) -> Result:
    if skipped is not None:
        return Result(SECTION, GROUP, name, kind, "us", skipped=skipped)
    return latency(Result(SECTION, GROUP, name, kind, "us"), runs)
