"""Contention: N forked processes hammer a contender's keys for a fixed window.

Every worker opens its own session (its own fleet node, file descriptors or
connection), warms up, waits on a barrier with the others and then calls
``cycle`` on a per-worker random sequence of keys until the window closes. A
busy key counts as an attempt, not an operation. The round reports the total
operations per second and the fairness: the smallest per-process count over
the largest, and over the fair share (total / N).
"""

from __future__ import annotations

import contextlib
import random
import statistics
import threading
import time
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.connection import Connection

from ._measure import Result, Skip
from ._workspace import Prepared

_ORDER = 256
_BARRIER_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Round:
    """One contention window: per-process successes and attempts, and its length."""

    counts: tuple[int, ...]
    attempts: tuple[int, ...]
    seconds: float

    @property
    def throughput(self) -> float:
        """Successful acquire + release pairs per second, all processes together."""
        return sum(self.counts) / self.seconds

    @property
    def min_max_share(self) -> float:
        """The smallest per-process count over the largest (1.0 = perfectly even)."""
        return min(self.counts) / max(*self.counts, 1)

    @property
    def min_fair_share(self) -> float:
        """The smallest per-process count over the fair share, total / N."""
        return min(self.counts) * len(self.counts) / max(sum(self.counts), 1)

    @property
    def busy_share(self) -> float:
        """The fraction of attempts that found the key taken (try-locks only)."""
        return 1.0 - sum(self.counts) / max(sum(self.attempts), 1)


def _hammer(
    prepared: Prepared, keys: int, index: int, seconds: float, barrier: threading.Barrier
) -> str:
    session = prepared.open()
    try:
        draw = random.Random(index).randrange
        order = [draw(keys) for _ in range(_ORDER)]
        cycle, now = session.cycle, time.perf_counter
        for key in order[:32]:
            cycle(key)
        barrier.wait(_BARRIER_TIMEOUT_S)
        done = attempts = 0
        started = now()
        deadline = started + seconds
        while now() < deadline:
            done += cycle(order[attempts % _ORDER])
            attempts += 1
        return f"{done} {attempts} {now() - started}"
    finally:
        session.close()


def _worker(
    prepared: Prepared,
    keys: int,
    index: int,
    seconds: float,
    barrier: threading.Barrier,
    out: Connection,
) -> None:
    try:
        out.send(_hammer(prepared, keys, index, seconds, barrier))
    except BaseException as exc:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.abort()
        out.send(f"error {type(exc).__name__}: {exc}")


def run_round(prepared: Prepared, procs: int, keys: int, seconds: float) -> Round:
    """Fork ``procs`` workers over ``keys`` keys for ``seconds``; raises Skip on failure."""
    context = get_context("fork")
    barrier = context.Barrier(procs + 1)
    pipes, workers = [], []
    for index in range(procs):
        receive, send = context.Pipe(duplex=False)
        worker = context.Process(
            target=_worker, args=(prepared, keys, index, seconds, barrier, send), daemon=True
        )
        worker.start()
        send.close()
        pipes.append(receive)
        workers.append(worker)
    try:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(_BARRIER_TIMEOUT_S)
        replies = [pipe.recv() if pipe.poll(seconds + 60) else "error no reply" for pipe in pipes]
    finally:
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
                worker.join()
    return _parse(replies)


def _parse(replies: list[str]) -> Round:
    errors = [reply for reply in replies if reply.startswith("error")]
    if errors:
        raise Skip(f"a worker failed: {errors[0][len('error ') :]}")
    fields = [reply.split() for reply in replies]
    return Round(
        counts=tuple(int(done) for done, _, _ in fields),
        attempts=tuple(int(attempts) for _, attempts, _ in fields),
        seconds=statistics.fmean(float(took) for _, _, took in fields),
    )


def record(result: Result, rounds: list[Round], procs: int, keys: int) -> Result:
    """Fill ``result`` with the rounds' throughputs and median fairness figures."""
    result.samples = [one.throughput for one in rounds]
    result.extra = {"processes": procs, "keys": keys}
    for name in ("min_max_share", "min_fair_share", "busy_share"):
        result.extra[name] = statistics.median(getattr(one, name) for one in rounds)
    return result
