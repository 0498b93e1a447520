"""Worker processes for the multi-process store tests, run by ``tests._processes``.

Each worker opens its own store from the URL and sends ``"done"`` at the end; an
exception travels back to the test as ``ChildFailed`` with the child's traceback.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import random
import time
from dataclasses import dataclass
from multiprocessing.sharedctypes import SynchronizedArray
from multiprocessing.synchronize import Barrier
from multiprocessing.synchronize import Lock as MpLock

from orbitive.store import Lock, open_store
from orbitive.store._shm import ShmEngine

from .._processes import Channel

CTX = multiprocessing.get_context("fork")
#: Seconds any barrier or reply may take before the test fails instead of hanging.
PATIENCE_S = 120.0


# -- concurrent schema creation ---------------------------------------------------------------


def open_and_lock(channel: Channel, url: str, index: int) -> None:
    """Open a store (creating its schema if needed) and take and give back one lock."""
    with open_store(url) as store:
        lock = store.try_lock(f"schema-{index}", "w", 60.0)
        if lock is None or not lock.release():
            raise AssertionError(f"schema-{index} was not free")
    channel.send("done")


# -- 16 processes race for one name ------------------------------------------------------------


def race_worker(
    channel: Channel,
    url: str,
    index: int,
    rounds: int,
    barrier: Barrier,
    wins: SynchronizedArray[int],
) -> None:
    """Each round: all try_lock one name at once; the winner counts itself and releases."""
    with open_store(url) as store:
        for round_no in range(rounds):
            barrier.wait(PATIENCE_S)
            lock = store.try_lock("race", f"racer-{index}", 60.0)
            if lock is not None:
                with wins.get_lock():
                    wins[round_no] += 1
            barrier.wait(PATIENCE_S)
            if lock is not None and not lock.release():
                raise AssertionError(f"round {round_no}: the winner's release returned False")
    channel.send("done")


# -- 8 processes of random operations ----------------------------------------------------------


@dataclass
class Shared:
    """Cross-process bookkeeping, guarded by ``guard``; index = name number.

    ``deadline``: local monotonic deadline of the current believed holder (0: none).
    ``token``: highest fencing token granted so far (the fence's high-water mark).
    ``writes``: fenced counter, incremented by holders whose token passes the fence.
    ``violations``: broken rules (two holders, old token, failed valid renew).
    """

    guard: MpLock
    deadline: ctypes.Array[ctypes.c_double]
    token: ctypes.Array[ctypes.c_longlong]
    writes: ctypes.Array[ctypes.c_longlong]
    violations: ctypes.c_longlong

    @classmethod
    def create(cls, names: int) -> Shared:
        return cls(
            CTX.Lock(),
            CTX.Array("d", names, lock=False),
            CTX.Array("q", names, lock=False),
            CTX.Array("q", names, lock=False),
            CTX.Value("q", 0, lock=False),
        )


STRESS_NAMES = 4
STRESS_TTLS = (0.002, 0.01, 0.05)


def stress_worker(channel: Channel, url: str, index: int, ops: int, shared: Shared) -> None:
    """``ops`` random try_lock / renew / release calls on four names with short TTLs."""
    rng = random.Random(index)
    mine: dict[int, Lock] = {}
    with open_store(url) as store:
        for _ in range(ops):
            slot = rng.randrange(STRESS_NAMES)
            lock = mine.get(slot)
            if lock is None:
                granted = store.try_lock(f"stress-{slot}", f"p{index}", rng.choice(STRESS_TTLS))
                if granted is not None:
                    _on_grant(shared, slot, granted)
                    mine[slot] = granted
            elif rng.random() < 0.6:
                if not _renew(shared, slot, lock, rng.choice(STRESS_TTLS)):
                    del mine[slot]
            else:
                _release(shared, slot, lock)
                del mine[slot]
            if rng.random() < 0.05:
                time.sleep(rng.uniform(0.0, 0.005))
    channel.send("done")


def _fenced_write(shared: Shared, slot: int, lock: Lock) -> None:
    """The resource side of a write, under ``guard``.

    A holder whose window already passed may be fenced off (that is the fence's
    job); a holder still inside its window must pass, with the largest token so
    far and no other believed holder.
    """
    token = lock.fencing_token
    if lock.remaining() <= 0.0:  # lapsed before it got here: not a believed holder
        shared.token[slot] = max(token, shared.token[slot])
        return
    if token < shared.token[slot]:
        shared.violations.value += 1
        return
    shared.token[slot] = token
    shared.writes[slot] += 1
    shared.deadline[slot] = time.monotonic() + lock.remaining()


def _on_grant(shared: Shared, slot: int, lock: Lock) -> None:
    with shared.guard:
        live = lock.remaining() > 0.0
        if live and shared.deadline[slot] > time.monotonic():  # previous holder still believes
            shared.violations.value += 1
        if live and lock.fencing_token <= shared.token[slot]:  # tokens must strictly increase
            shared.violations.value += 1
        _fenced_write(shared, slot, lock)


def _renew(shared: Shared, slot: int, lock: Lock, ttl: float) -> bool:
    valid_until = time.monotonic() + lock.remaining()
    with shared.guard:  # a renew may shorten the lease (new full window): believe less first
        if shared.token[slot] == lock.fencing_token:
            # The shm table reads its clock in whole milliseconds (rounded down), so
            # its new expiry may come up to 1 ms before now + ttl.
            soonest = time.monotonic() + ttl - 0.001
            shared.deadline[slot] = min(shared.deadline[slot], soonest)
    renewed = lock.renew(ttl)
    if not renewed:
        if time.monotonic() < valid_until:  # a renew of a validly held lock never fails
            with shared.guard:
                shared.violations.value += 1
        return False
    with shared.guard:
        _fenced_write(shared, slot, lock)
    return True


def _release(shared: Shared, slot: int, lock: Lock) -> None:
    with shared.guard:
        if shared.token[slot] == lock.fencing_token:
            shared.deadline[slot] = 0.0  # stop believing before the lease goes
    lock.release()


# -- processes taking turns on one name ---------------------------------------------------------


def wait_in_turn(channel: Channel, url: str, name: str) -> None:
    """Say ("waiting", node), then on "go" wait for ``name``; report ("granted", at).

    Hold it until told, then release it.
    """
    with open_store(url) as store:
        engine = store._backend.engine
        assert isinstance(engine, ShmEngine)
        channel.send(("waiting", engine._fleet.node))
        channel.recv(None)
        with store.lock(name, ttl=60.0, timeout=PATIENCE_S):
            channel.send(("granted", time.monotonic()))
            channel.recv(None)


def take_turns(
    channel: Channel,
    url: str,
    index: int,
    barrier: Barrier,
    seconds: float,
    turns: SynchronizedArray[int],
) -> None:
    """After the barrier, take ``name`` over and over for ``seconds``; count the turns.

    ``turns[index]`` counts this process's turns; ``turns[-2]`` the turns that went to
    another process than the one before (hand-overs), ``turns[-1]`` the last holder + 1,
    both written only while holding the lock.
    """
    with open_store(url) as store:
        barrier.wait(PATIENCE_S)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with store.lock("turns", ttl=10.0, timeout=PATIENCE_S):
                turns[index] += 1
                if turns[-1] != index + 1:
                    turns[-2] += 1
                    turns[-1] = index + 1
    channel.send("done")
