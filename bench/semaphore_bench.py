"""Semaphore try_acquire + release beside the named-lock pair, on each engine (issue 23).

Run: ``.venv/bin/python bench/semaphore_bench.py [--pairs N]
[--engines sqlite,postgres,shm,redis] [--limit L] [--postgres URL]``. On one store
per engine, in one run, it times pair by pair and interleaved (so that all see the
same machine load), after a warm-up of each:

* the named-lock pair: ``store.try_lock`` + ``lock.release``;
* the semaphore pair: ``sem.try_acquire`` + ``lease.release`` on a semaphore of
  limit L (default 5) that nobody else holds;
* the same with the L - 1 lower slots held by other owners, so the grant takes the
  last free slot.

It prints the medians and the ratio of each semaphore pair to the lock pair.
Target (issue 23): the semaphore pair at most 1.5x the lock pair. The last-slot
row shows what the held slots below the free one add: nothing that grows on the
SQL engines and Redis (one statement or script), one table step per held slot on
SHM. The servers and files are throw-away ones, as in ``bench/store_bench.py``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.store_bench import NETWORK, engine_url, interleaved_us
from orbitive.store import Store, open_store
from tests._servers import ServerUnavailable

#: Largest ratio of a semaphore pair's median to the named-lock pair's (issue 23).
TARGET_RATIO = 1.5


def medians_us(store: Store, pairs: int, limit: int) -> tuple[float, float, float]:
    """Median microseconds of a lock pair, a semaphore pair, and one on a nearly full one."""
    try_lock = store.try_lock
    empty = store.semaphore("bench/empty", limit).try_acquire
    nearly = store.semaphore("bench/nearly-full", limit)
    others = [nearly.try_acquire(f"other-{slot}", 3600.0) for slot in range(limit - 1)]
    assert all(lease is not None for lease in others)
    last = nearly.try_acquire

    def lock_pair() -> None:
        lock = try_lock("bench/lock", "bench-owner", 30.0)
        assert lock is not None
        lock.release()

    def semaphore_pair() -> None:
        lease = empty("bench-owner", 30.0)
        assert lease is not None
        lease.release()

    def last_slot_pair() -> None:
        lease = last("bench-owner", 30.0)
        assert lease is not None and lease.slot == limit - 1
        lease.release()

    samples = interleaved_us((lock_pair, semaphore_pair, last_slot_pair), pairs)
    lock_us, semaphore_us, last_us = (statistics.median(times) for times in samples)
    return lock_us, semaphore_us, last_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--engines", default="sqlite,postgres,shm,redis")
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--postgres", default=None, metavar="URL")
    args = parser.parse_args()
    header = ("engine", "lock pair", "semaphore", "ratio", "last slot", "ratio")
    print("{:<9} {:>11} {:>11} {:>6} {:>11} {:>6}".format(*header))
    for engine in args.engines.split(","):
        pairs = args.pairs if engine not in NETWORK else max(args.pairs // 10, 100)
        try:
            with engine_url(engine, args.postgres) as url, open_store(url) as store:
                lock_us, semaphore_us, last_us = medians_us(store, pairs, args.limit)
        except ServerUnavailable as error:
            print(f"{engine:<9} skipped: {error}")
            continue
        ratio, last_ratio = semaphore_us / lock_us, last_us / lock_us
        verdict = "ok" if ratio <= TARGET_RATIO else "MISSES"
        print(
            f"{engine:<9} {lock_us:>8.2f} us {semaphore_us:>8.2f} us {ratio:>5.2f}x "
            f"{last_us:>8.2f} us {last_ratio:>5.2f}x  ({pairs} pairs each, interleaved; "
            f"limit {args.limit}; target <= {TARGET_RATIO:g}x: {verdict})"
        )


if __name__ == "__main__":
    main()
