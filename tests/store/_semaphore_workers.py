"""Worker processes for the multi-process semaphore tests, run by ``tests._processes``.

Racers take slots at a barrier; churners run random operations until a shared
budget is spent (they may be SIGKILLed at any instant); the observer, a process of
its own with its own store, checks every snapshot it reads against the rules.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from multiprocessing.sharedctypes import Synchronized, SynchronizedArray
from multiprocessing.synchronize import Barrier

from orbitive.store import SemaphoreLease, open_store

from .._processes import Channel
from ._workers import CTX, PATIENCE_S

#: The semaphores the churners share, and their limit.
CHURN_NAMES = ("churn-0", "churn-1")
CHURN_LIMIT = 3
#: Lease lengths of the churners, in seconds: some lapse while their holder runs on.
CHURN_TTLS = (0.03, 0.1, 0.4)


def race_slots(
    channel: Channel,
    url: str,
    index: int,
    rounds: int,
    limit: int,
    barrier: Barrier,
    wins: SynchronizedArray[int],
) -> None:
    """Each round: all try_acquire one semaphore at once; winners count and release."""
    with open_store(url) as store:
        sem = store.semaphore("race", limit)
        for round_no in range(rounds):
            barrier.wait(PATIENCE_S)
            lease = sem.try_acquire(f"racer-{index}", 60.0)
            if lease is not None:
                with wins.get_lock():
                    wins[round_no] += 1
            barrier.wait(PATIENCE_S)
            if lease is not None and not lease.release():
                raise AssertionError(f"round {round_no}: a winner's release returned False")
    channel.send("done")


@dataclass
class Budget:
    """The churners' operations, one counter per seat, and the observer's stop flag.

    A seat is one churner at a time (a killed churner's replacement takes its seat
    and the rest of its operations), so each counter has one writer and needs no
    lock: a lock held by a process SIGKILLed inside it would stop every other.
    The churners pause while the operations of all seats reach ``allowed``, which
    the test raises after each kill, so kills come at the operation counts it
    chose however fast the engine is.
    """

    done: SynchronizedArray[int]
    each: int
    stop: Synchronized[int]
    allowed: Synchronized[int]

    @classmethod
    def create(cls, seats: int, each: int, allowed: int) -> Budget:
        return cls(
            CTX.Array("q", seats, lock=False),
            each,
            CTX.Value("i", 0, lock=False),
            CTX.Value("q", allowed, lock=False),
        )

    @property
    def total(self) -> int:
        """Operations done so far by every seat."""
        return sum(self.done[:])

    def spent(self) -> bool:
        return all(count >= self.each for count in self.done[:])


def churn(channel: Channel, url: str, seat: int, life: int, budget: Budget) -> None:
    """Random try_acquire / renew / release on :data:`CHURN_NAMES` until its seat's
    operations are done (``life`` tells the seat's successive churners apart).

    Checks its own grants: a slot below the limit, and a token above every token
    this process was granted before for that name.
    """
    rng = random.Random(life * 1000 + seat)
    mine: dict[str, list[SemaphoreLease]] = {name: [] for name in CHURN_NAMES}
    highest = dict.fromkeys(CHURN_NAMES, 0)
    with open_store(url) as store:
        sems = {name: store.semaphore(name, CHURN_LIMIT) for name in CHURN_NAMES}
        channel.send("ready")
        while budget.done[seat] < budget.each:
            if budget.total >= budget.allowed.value:
                time.sleep(0.001)  # the test is about to kill one of us
                continue
            budget.done[seat] += 1
            name = rng.choice(CHURN_NAMES)
            held = mine[name]
            roll = rng.random()
            if not held or (roll < 0.4 and len(held) < 2):
                lease = sems[name].try_acquire(f"c{seat}.{life}", rng.choice(CHURN_TTLS))
                if lease is not None:
                    if not 0 <= lease.slot < CHURN_LIMIT or lease.fencing_token <= highest[name]:
                        raise AssertionError(f"bad grant {lease!r} after token {highest[name]}")
                    highest[name] = lease.fencing_token
                    held.append(lease)
            elif roll < 0.7:
                lease = rng.choice(held)
                if not lease.renew(rng.choice(CHURN_TTLS)):
                    held.remove(lease)
            else:
                lease = held.pop(rng.randrange(len(held)))
                lease.release()
            if rng.random() < 0.05:
                time.sleep(rng.uniform(0.0, 0.003))
    channel.send("done")


def observe(channel: Channel, url: str, budget: Budget) -> None:
    """Read every semaphore's holders until stopped; report broken rules and what was seen.

    Per snapshot of one name (one statement, script or critical section): at most
    the limit of live holders, each in its own slot below the limit, granted under
    the limit; a holder seen for the first time has a token larger than every token
    seen in earlier snapshots (a holder granted earlier would have been live then).
    """
    broken: list[str] = []
    snapshots = most = 0
    seen: dict[str, set[tuple[int, int]]] = {name: set() for name in CHURN_NAMES}
    highest = dict.fromkeys(CHURN_NAMES, 0)
    with open_store(url) as store:
        sems = [store.semaphore(name, CHURN_LIMIT) for name in CHURN_NAMES]
        channel.send("ready")
        while not budget.stop.value:
            for sem in sems:
                holders = sem.holders()
                snapshots += 1
                most = max(most, len(holders))
                slots = [info.slot for info in holders]
                if len(holders) > CHURN_LIMIT or len(set(slots)) != len(slots):
                    broken.append(f"{sem.name}: {holders}")
                if any(info.limit != CHURN_LIMIT or info.slot >= CHURN_LIMIT for info in holders):
                    broken.append(f"{sem.name}: out of range {holders}")
                fresh = {(info.slot, info.fencing_token) for info in holders} - seen[sem.name]
                if any(token <= highest[sem.name] for _, token in fresh):
                    broken.append(f"{sem.name}: a new holder's token is not above {highest}")
                seen[sem.name] |= fresh
                highest[sem.name] = max([highest[sem.name], *(token for _, token in fresh)])
    channel.send((broken, snapshots, most, max(highest.values())))
