"""LockTable try_acquire + release, uncontended, one process, beside a bare flock pair.

Run: ``.venv/bin/python bench/lock_bench.py [--pairs N] [--repeats R]``. Prints the
median (and min/max) microseconds per pair over R repeats of N pairs each.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import statistics
import tempfile
import time
from collections.abc import Callable

from orbitive import Fleet
from orbitive.cli import main as orbit
from orbitive.lock import LockKey, LockOwner, LockTable


def per_pair_us(run: Callable[[int], None], pairs: int, repeats: int) -> list[float]:
    """Microseconds per pair for each of ``repeats`` timed runs of ``pairs`` pairs."""
    run(min(pairs, 1000))  # warm up
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        run(pairs)
        samples.append((time.perf_counter() - started) / pairs * 1e6)
    return samples


def flock_pairs(pairs: int) -> None:
    with tempfile.NamedTemporaryFile() as handle:
        fd = handle.fileno()
        for _ in range(pairs):
            fcntl.flock(fd, fcntl.LOCK_EX)
            fcntl.flock(fd, fcntl.LOCK_UN)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    fleet = Fleet.join(f"bench-lock-{os.getpid()}", capacity=4)
    table = LockTable(fleet)
    key, owner = LockKey("bench", "key"), LockOwner(b"bench-owner")

    def lock_pairs(pairs: int) -> None:
        acquire, release = table.try_acquire, table.release
        for _ in range(pairs):
            release(acquire(key, owner, 30.0).lease)

    try:
        for name, run in (
            ("LockTable try_acquire+release", lock_pairs),
            ("fcntl.flock pair", flock_pairs),
        ):
            samples = per_pair_us(run, args.pairs, args.repeats)
            print(
                f"{name:<32} median {statistics.median(samples):7.2f} us  "
                f"(min {min(samples):.2f}, max {max(samples):.2f}, {args.repeats} x {args.pairs})"
            )
    finally:
        table.close()
        fleet.close()
        orbit(["clear", fleet.name, "--all", "--yes"])


if __name__ == "__main__":
    main()
