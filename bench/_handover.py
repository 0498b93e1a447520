"""Hand-over: processes taking turns on one key, each through its lock's blocking form.

For 2, 4 and 8 forked processes, every contender runs the same loop: acquire
(blocking), note the turn, release, again, for the window. Inside each turn the
holder reads the stamp the previous holder wrote into shared memory just before
its release: when that was another process, the turn is a **hand-over** and
``now - stamp`` its latency (a release in one process until the waiter in
another holds the lock). Each window gives the turns per second, the min/max
fairness of the per-process counts, the share of turns that were hand-overs and
the median hand-over latency. The floor of a hand-over is one wake-up: a byte
written to a pipe another process is blocked on (:func:`._wake.pipe_latency_us`).

Contenders: ``fcntl.flock`` blocking on one file (the kernel's own lock, which
lets a releasing process take the lock straight back, so few of its turns are
hand-overs), ``filelock.FileLock`` (polls), ``with store.lock()`` on ``shm://``
and ``LockTable.wait_acquire`` (queued behind the waiters after a release that
found some, as the store does).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import get_context
from multiprocessing.connection import Connection
from typing import Any

from orbitive import Fleet
from orbitive.lock import Acquired, LockKey, LockOwner, LockTable

from . import _wake
from ._contenders import FLEET_CAPACITY, need
from ._measure import Kind, Result, Settings, Skip
from ._workspace import Workspace
from .readiness_wake import percentile, remove_fleet_files

SECTION = "hand-over"
PROCESS_COUNTS = (2, 4, 8)
_STAMP = struct.Struct("<QQ")  # monotonic ns just before the release, holder index + 1
_SAMPLES = 400  # latencies kept per process and window
_BARRIER_TIMEOUT_S = 60.0

#: A session's blocking acquire and release, and what closes it.
Turns = tuple[Callable[[], None], Callable[[], None], Callable[[], None]]


@dataclass(frozen=True)
class Taker:
    """One contender: ``prepare(ws)`` returns what each process calls to open its session."""

    name: str
    kind: Kind
    prepare: Callable[[Workspace], tuple[Callable[[], Turns], Callable[[], None]]]


def _flock(ws: Workspace) -> tuple[Callable[[], Turns], Callable[[], None]]:
    path = ws.root / ws.unique("turns")
    path.touch()

    def open_session() -> Turns:
        fd = os.open(path, os.O_RDWR)
        return (
            lambda: fcntl.flock(fd, fcntl.LOCK_EX),
            lambda: fcntl.flock(fd, fcntl.LOCK_UN),
            lambda: os.close(fd),
        )

    return open_session, lambda: None


def _filelock(ws: Workspace) -> tuple[Callable[[], Turns], Callable[[], None]]:
    package: Any = need("filelock")
    path = str(ws.root / ws.unique("turns"))

    def open_session() -> Turns:
        lock = package.FileLock(path)
        return lock.acquire, lock.release, lambda: None

    return open_session, lambda: None


def _store(ws: Workspace) -> tuple[Callable[[], Turns], Callable[[], None]]:
    store_module: Any = need("orbitive.store", hint="not in this checkout yet")
    name = ws.unique("bturns")

    def open_session() -> Turns:
        store = store_module.open_store(f"shm://{name}?capacity={FLEET_CAPACITY}")
        held: list[Any] = []

        def acquire() -> None:
            held.append(store.lock("turns", ttl=30.0, timeout=_BARRIER_TIMEOUT_S))

        return acquire, lambda: held.pop().release(), store.close

    return open_session, lambda: remove_fleet_files(name)


def _table(ws: Workspace) -> tuple[Callable[[], Turns], Callable[[], None]]:
    name = ws.unique("bturns")
    key = LockKey("bench", "turns")

    def open_session() -> Turns:
        fleet = Fleet.join(name, FLEET_CAPACITY)
        table = LockTable(fleet)
        owner = LockOwner(f"turns-{os.getpid()}".encode())
        state = {"waiting": 0}
        held: list[Any] = []

        def acquire() -> None:
            got = table.wait_acquire(
                key, owner, 30.0, _BARRIER_TIMEOUT_S, queue=state["waiting"] > 0
            )
            assert isinstance(got, Acquired)
            held.append(got.lease)

        def release() -> None:
            state["waiting"] = table.release_waking(held.pop())

        def close() -> None:
            table.close()
            fleet.close()

        return acquire, release, close

    return open_session, lambda: remove_fleet_files(name)


TAKERS: tuple[Taker, ...] = (
    Taker("orbitive store: SHM, with store.lock()", "orbitive", _store),
    Taker("orbitive LockTable.wait_acquire", "orbitive", _table),
    Taker("fcntl.flock, blocking", "alternative", _flock),
    Taker("filelock.FileLock", "alternative", _filelock),
)


@dataclass(frozen=True)
class Window:
    """What one window of N processes gave."""

    counts: tuple[int, ...]
    handovers: int
    latencies_us: list[float]
    seconds: float

    @property
    def turns_per_s(self) -> float:
        return sum(self.counts) / self.seconds


def _take_turns(
    open_session: Callable[[], Turns],
    index: int,
    seconds: float,
    barrier: threading.Barrier,
    shared: mmap.mmap,
    out: Connection,
) -> None:
    try:
        acquire, release, close = open_session()
        try:
            for _ in range(8):  # warm up, outside the window
                acquire()
                release()
            barrier.wait(_BARRIER_TIMEOUT_S)
            me, count, handovers = index + 1, 0, 0
            latencies: list[float] = []
            clock, unpack, pack = time.monotonic_ns, _STAMP.unpack_from, _STAMP.pack_into
            started = time.monotonic()
            deadline = started + seconds
            while time.monotonic() < deadline:
                acquire()
                now = clock()
                stamp, holder = unpack(shared, 0)
                if holder not in (0, me):
                    handovers += 1
                    if len(latencies) < _SAMPLES:
                        latencies.append((now - stamp) / 1000.0)
                count += 1
                pack(shared, 0, clock(), me)
                release()
            out.send((count, handovers, latencies, time.monotonic() - started))
        finally:
            close()
    except BaseException as exc:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.abort()
        out.send(f"error {type(exc).__name__}: {exc}")


def run_window(open_session: Callable[[], Turns], procs: int, seconds: float) -> Window:
    """Fork ``procs`` processes taking turns for ``seconds``; raises Skip on failure."""
    context = get_context("fork")
    barrier = context.Barrier(procs + 1)
    shared = mmap.mmap(-1, mmap.PAGESIZE)
    pipes, workers = [], []
    for index in range(procs):
        receive, send = context.Pipe(duplex=False)
        worker = context.Process(
            target=_take_turns,
            args=(open_session, index, seconds, barrier, shared, send),
            daemon=True,
        )
        worker.start()
        send.close()
        pipes.append(receive)
        workers.append(worker)
    try:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(_BARRIER_TIMEOUT_S)
        replies: list[Any] = [
            pipe.recv() if pipe.poll(seconds + 60) else "error no reply" for pipe in pipes
        ]
    finally:
        for worker in workers:
            worker.join(10)
            if worker.is_alive():
                worker.kill()
                worker.join()
        shared.close()
    errors = [reply for reply in replies if isinstance(reply, str)]
    if errors:
        raise Skip(f"a worker failed: {errors[0][len('error ') :]}")
    done: list[tuple[int, int, list[float], float]] = replies
    return Window(
        counts=tuple(count for count, _, _, _ in done),
        handovers=sum(handed for _, handed, _, _ in done),
        latencies_us=[sample for _, _, samples, _ in done for sample in samples],
        seconds=max(took for _, _, _, took in done),
    )


def handover_results(ws: Workspace, settings: Settings) -> list[Result]:
    """Per process count: a turns row and a hand-over latency row per contender, and the
    pipe floor beside the latencies (every figure the median over ``settings.rounds``)."""
    floor_runs = [_wake.pipe_latency_us(settings.wakes) for _ in range(settings.wake_repeats)]
    results = []
    for procs in PROCESS_COUNTS:
        turns_group = f"{procs} processes: turns per second"
        latency_group = f"{procs} processes: hand-over latency"
        floor = Result(SECTION, latency_group, "os.pipe write -> select (floor)", "floor", "us")
        results.append(_wake.latency(floor, floor_runs))
        for taker in TAKERS:
            turns = Result(SECTION, turns_group, taker.name, taker.kind, "ops/s")
            latency = Result(SECTION, latency_group, taker.name, taker.kind, "us")
            try:
                open_session, cleanup = taker.prepare(ws)
                try:
                    windows = [
                        run_window(open_session, procs, settings.window)
                        for _ in range(settings.rounds)
                    ]
                finally:
                    cleanup()
            except Skip as exc:
                turns.skipped = latency.skipped = str(exc)
                results += [turns, latency]
                continue
            _record(turns, latency, windows)
            results += [turns, latency]
        _against_filelock([r for r in results if r.group == turns_group])
    return results


def _against_filelock(group: list[Result]) -> None:
    """Note each orbitive row's turns over filelock's (the issue's yardstick: 3x)."""
    filelock = next((r for r in group if r.name == "filelock.FileLock" and r.samples), None)
    if filelock is None:
        return
    for result in group:
        if result.kind == "orbitive" and result.samples:
            result.extra["over_filelock"] = result.median / filelock.median


def _record(turns: Result, latency: Result, windows: list[Window]) -> None:
    turns.samples = [window.turns_per_s for window in windows]
    middle = sorted(windows, key=lambda window: window.turns_per_s)[len(windows) // 2]
    turns.extra = {
        "min_max_share": min(middle.counts) / max(*middle.counts, 1),
        "min_fair_share": min(middle.counts) * len(middle.counts) / max(sum(middle.counts), 1),
        "handover_share": middle.handovers / max(sum(middle.counts), 1),
    }
    handed = [window for window in windows if window.latencies_us]
    if not handed:
        latency.skipped = "no turn was handed over to another process"
        return
    latency.samples = [percentile(window.latencies_us, 0.5) for window in handed]
    every = [sample for window in handed for sample in window.latencies_us]
    latency.extra = {"p99_us": percentile(every, 0.99), "wakes": len(every)}
