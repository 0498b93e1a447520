"""Cross-process wake latency: orbitive readiness beside a bare pipe (the floor), interleaved.

One forked publisher serves every mechanism: per round, for each mechanism in
turn, the parent blocks on it and asks the child to fire; the child waits
:data:`PAUSE_S` (so the parent is asleep when it fires), stamps
``CLOCK_MONOTONIC`` into shared memory and fires; the parent stamps again when
it wakes. Interleaving gives every mechanism the same machine load, which on a
shared VM moves more than the mechanisms differ.

* **floor**: a byte written to a pipe the parent is blocked on in ``select``.
* **orbitive readiness (socket)**: a lock table transition in the child (a
  ``try_acquire`` or a ``release``, alternately: the C step publishes, then
  sends one datagram to each armed socket), the parent blocked in ``select`` on
  its ``table.fileno()``; it drains (and so arms again) after each wake.
"""

from __future__ import annotations

import mmap
import os
import selectors
import struct
import time
from multiprocessing import get_context
from multiprocessing.connection import Connection

from orbitive import Fleet
from orbitive.lock import Acquired, LockKey, LockOwner, LockTable

from . import readiness_wake
from ._contenders import FLEET_CAPACITY
from ._measure import Result

_STAMP = struct.Struct("<Q")
_KEY = LockKey("bench", "wake")
SECTION = "wake latency"
GROUP = "publish -> readable"
#: How long the publisher waits after a request before it fires, in seconds.
PAUSE_S = 0.0002
_PIPE, _READINESS = b"p", b"r"


def _publisher(commands: Connection, write_fd: int, table: LockTable, stamp: mmap.mmap) -> None:
    """The forked child: fire what is asked, :data:`PAUSE_S` after each request."""
    owner, held = LockOwner(b"bench-wake"), None
    while (what := commands.recv()) is not None:
        time.sleep(PAUSE_S)
        if what == _PIPE:
            os.write(write_fd, _STAMP.pack(time.monotonic_ns()))
            continue
        _STAMP.pack_into(stamp, 0, time.monotonic_ns())
        if held is None:
            got = table.try_acquire(_KEY, owner, 60.0)
            assert isinstance(got, Acquired)
            held = got.lease
        else:
            table.release(held)
            held = None
    os._exit(0)


def interleaved_us(rounds: int) -> dict[bytes, list[float]]:
    """Latencies in microseconds of the pipe floor and of readiness, ``rounds`` each."""
    name = f"bwake-{os.getpid()}"
    fleet = Fleet.join(name, FLEET_CAPACITY)
    table = LockTable(fleet)
    stamp = mmap.mmap(-1, mmap.PAGESIZE)
    read_fd, write_fd = os.pipe()
    parent_end, child_end = get_context("fork").Pipe()
    child = get_context("fork").Process(
        target=_publisher, args=(child_end, write_fd, table, stamp), daemon=True
    )
    child.start()
    samples: dict[bytes, list[float]] = {_PIPE: [], _READINESS: []}
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(read_fd, selectors.EVENT_READ, _PIPE)
            selector.register(table.fileno(), selectors.EVENT_READ, _READINESS)
            for _ in range(rounds):
                for what in (_PIPE, _READINESS):
                    parent_end.send(what)
                    events = selector.select(5.0)
                    woke = time.monotonic_ns()
                    if [key.data for key, _ in events] != [what]:
                        raise RuntimeError(f"wrong or no wake within 5 s for {what!r}")
                    if what == _PIPE:
                        sent = _STAMP.unpack(os.read(read_fd, _STAMP.size))[0]
                    else:
                        table.drain()
                        sent = _STAMP.unpack_from(stamp, 0)[0]
                    samples[what].append((woke - sent) / 1000)
    finally:
        parent_end.send(None)
        child.join(10)
        table.unlink()
        table.close()
        fleet.close()
        readiness_wake.remove_fleet_files(name)
        stamp.close()
        os.close(read_fd)
        os.close(write_fd)
    return samples


def pipe_latency_us(rounds: int) -> list[float]:
    """Pipe write -> select readable latencies, in microseconds (the floor alone)."""
    return interleaved_us(rounds)[_PIPE]


def wake_results(rounds: int, repeats: int) -> list[Result]:
    """The readiness row and the pipe floor, interleaved, ``repeats`` runs of ``rounds``.

    A sample is one run's p50; ``extra["p99_us"]`` is the p99 over every wake of every run.
    """
    runs = [interleaved_us(rounds) for _ in range(repeats)]
    readiness = Result(SECTION, GROUP, "orbitive readiness (socket)", "orbitive", "us")
    floor = Result(SECTION, GROUP, "os.pipe write -> select", "floor", "us")
    return [
        latency(readiness, [run[_READINESS] for run in runs]),
        latency(floor, [run[_PIPE] for run in runs]),
    ]


def latency(result: Result, runs: list[list[float]]) -> Result:
    """Fill ``result``: each sample is one run's p50; ``extra["p99_us"]`` is over every run."""
    every = [sample for run in runs for sample in run]
    result.samples = [readiness_wake.percentile(run, 0.5) for run in runs]
    result.extra = {"p99_us": readiness_wake.percentile(every, 0.99), "wakes": len(every)}
    return result
