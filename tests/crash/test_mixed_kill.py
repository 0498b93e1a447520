"""Processes on the C operations and on the Python ones, with threads, killed at random.

Half of the churners unbind the C operations (``table._bind(None)``) (on a
flock section all of them run the Python operations); each runs
two threads that take one key, write their thread id and their lease's end into
a shared witness, hold briefly, check the witness is still theirs, renew and
release. The test kills churners with SIGKILL at random moments and checks,
after every kill, that the table answers (no wedge), that at most one entry is
live, and that the witness never names two live holders at once within their
tenures. (A holder stalled past its lease on a loaded machine is overtaken
rightly: each check counts a breach only while the lease it guards is in force
by the clock the table uses.) Some kills must land inside a section (the robust
mutex is repaired: its recovery count grows).
"""

from __future__ import annotations

import mmap
import os
import random
import threading
import time

import pytest

from orbitive import Fleet
from orbitive._core._section import recoveries
from orbitive.lock import Acquired, LockOwner, LockTable

from .._children import KEY
from .._processes import Channel, Processes

#: A short lease, so that a killed holder's tenure ends soon.
TTL = 0.3
KILLS = 40
#: Kills at most, until one landed inside a section (the mutex repaired).
MOST_KILLS = 200
#: Witness layout: the tid of the holder at 0, the end of its lease at 8 (monotonic
#: microseconds, 0 once it is released), a breach flag at 16.
WITNESS_BYTES = 24


def _alive(tid: int) -> bool:
    try:
        os.kill(tid, 0)
    except ProcessLookupError:
        return False
    return True


def _read(witness: mmap.mmap, at: int) -> int:
    return int.from_bytes(witness[at : at + 8], "little")


def _write(witness: mmap.mmap, at: int, value: int) -> None:
    witness[at : at + 8] = value.to_bytes(8, "little")


def _microseconds(monotonic: float) -> int:
    return int(monotonic * 1_000_000)


def _hold(table: LockTable, witness: mmap.mmap, owner: LockOwner) -> None:
    me = threading.get_native_id()
    while True:
        result = table.try_acquire(KEY, owner, TTL)
        if not isinstance(result, Acquired):
            continue
        before, before_ends = _read(witness, 0), _read(witness, 8)
        if (
            before
            and before != me
            and _alive(before)
            and _microseconds(time.monotonic()) < before_ends
        ):
            _write(witness, 16, before)  # two live holders, both within their leases
        _write(witness, 8, _microseconds(result.lease.expires_at))
        _write(witness, 0, me)
        time.sleep(0.0005)
        if _read(witness, 0) != me and time.monotonic() < result.lease.expires_at:
            _write(witness, 16, me)  # overtaken within this lease
        table.renew(result.lease, TTL)
        _write(witness, 8, 0)  # released: no lease left to overlap
        table.release(result.lease)


def repaired(table: LockTable, mechanism: str) -> bool:
    """Whether a kill landed inside a section (counted by the mutex only)."""
    return mechanism == "flock" or recoveries(table._state.block) >= 1


def churn(channel: Channel, fleet_name: str, witness_fd: int, python: bool) -> None:
    table = LockTable(Fleet.join(fleet_name, 8))
    if python:
        table._bind(None)
    witness = mmap.mmap(witness_fd, WITNESS_BYTES)
    owner = LockOwner(f"churner-{os.getpid()}")
    for _ in range(2):
        threading.Thread(target=_hold, args=(table, witness, owner), daemon=True).start()
    channel.send("running")
    threading.Event().wait()


@pytest.mark.parametrize("mechanism", ["mutex", "flock"])
def test_mixed_c_and_python_churners_killed_at_random_never_hold_twice(
    fleet_name: str, mechanism: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORBIT_SECTION", mechanism)  # flock: the Python operations only
    witness_fd = os.memfd_create("orbit-witness")
    os.ftruncate(witness_fd, WITNESS_BYTES)
    witness = mmap.mmap(witness_fd, WITNESS_BYTES)
    table = LockTable(Fleet.join(fleet_name, 8))
    rng = random.Random(20261201)
    with Processes("fork") as processes:
        children = [processes.start(churn, fleet_name, witness_fd, n % 2 == 1) for n in range(4)]
        for child in children:
            assert child.recv() == "running"
        kills = 0
        while kills < KILLS or (not repaired(table, mechanism) and kills < MOST_KILLS):
            kill, kills = kills, kills + 1
            time.sleep(rng.uniform(0.0, 0.02))
            victim = children[kill % len(children)]
            victim.kill()
            statistics = table.statistics()  # would wait for ever on a wedged section
            assert statistics.occupied_count + statistics.expired_count <= 1
            children[kill % len(children)] = replacement = processes.start(
                churn, fleet_name, witness_fd, kill % 2 == 1
            )
            assert replacement.recv() == "running"
    assert _read(witness, 16) == 0, "two live holders at once"
    assert repaired(table, mechanism), f"no kill of {kills} landed in a section"
    time.sleep(TTL)  # every killed holder's tenure has ended
    assert isinstance(table.try_acquire(KEY, LockOwner(b"tester"), 30.0), Acquired)
    os.close(witness_fd)
    table.unlink()
