"""LockTable try_acquire + release of new keys in a table churned near full.

The table is filled to ``--fill`` of ``--capacity`` slots with distinct keys,
then churned (release a random key, acquire a new one) until the EMPTY slots
are used up; each timed pair acquires a key never seen before and releases it.

Run: ``.venv/bin/python bench/lock_churn.py [--capacity C] [--fill F] [--pairs N]
[--repeats R]``. Prints the median (and min/max) microseconds per pair over R
repeats of N pairs, with the table's EMPTY slot count and probe bound.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import statistics
import time

from orbitive import Fleet
from orbitive.cli import main as orbit
from orbitive.lock import Acquired, LockKey, LockLayout, LockLease, LockOwner, LockTable

OWNER = LockOwner(b"bench-owner")


class Keys:
    """Distinct keys, never repeated."""

    def __init__(self) -> None:
        self.issued = 0

    def take(self, count: int) -> list[LockKey]:
        start, self.issued = self.issued, self.issued + count
        return [LockKey("bench.churn", f"key-{n}") for n in range(start, self.issued)]


def acquire(table: LockTable, key: LockKey) -> LockLease:
    result = table.try_acquire(key, OWNER, 3600.0)
    assert isinstance(result, Acquired), key
    return result.lease


def fill_and_churn(table: LockTable, keys: Keys, held: int, rounds: int) -> None:
    rng = random.Random(0)
    leases = [acquire(table, key) for key in keys.take(held)]
    for key in keys.take(rounds):
        index = rng.randrange(len(leases))
        table.release(leases[index])
        leases[index] = acquire(table, key)


def timed_pairs(table: LockTable, keys: list[LockKey]) -> float:
    """Microseconds per try_acquire + release of each of ``keys``."""
    try_acquire, release = table.try_acquire, table.release
    started = time.perf_counter()
    for key in keys:
        release(try_acquire(key, OWNER, 30.0).lease)
    return (time.perf_counter() - started) / len(keys) * 1e6


def describe(table: LockTable) -> str:
    stats = table.statistics()
    empty = stats.capacity - stats.occupied_count - stats.expired_count - stats.tombstone_count
    bound = getattr(stats, "max_probe", "n/a (no probe bound)")
    return f"{stats.occupied_count} live, {empty} EMPTY of {stats.capacity}; max_probe {bound}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--capacity", type=int, default=4096)
    parser.add_argument("--fill", type=float, default=0.9)
    parser.add_argument("--churn", type=int, default=4, help="churn rounds per slot")
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    fleet = Fleet.join(f"bench-churn-{os.getpid()}", capacity=2)
    table = LockTable(fleet, LockLayout(capacity=args.capacity))
    keys = Keys()
    try:
        fill_and_churn(table, keys, int(args.capacity * args.fill), args.churn * args.capacity)
        print(describe(table))
        samples = [timed_pairs(table, keys.take(args.pairs)) for _ in range(args.repeats)]
        print(
            f"new-key try_acquire+release  median {statistics.median(samples):8.2f} us  "
            f"(min {min(samples):.2f}, max {max(samples):.2f}, {args.repeats} x {args.pairs})"
        )
        print(describe(table))
    finally:
        table.close()
        table.unlink()
        fleet.close()
        with contextlib.redirect_stdout(io.StringIO()):  # "removed 0 object(s)": noise
            orbit(["clear", fleet.name, "--all", "--yes"])  # the fleet's lock files


if __name__ == "__main__":
    main()
