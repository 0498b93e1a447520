"""What one ``limits`` hit costs on ``shm://`` against ``memory://`` (issue 33).

Run: ``.venv/bin/python bench/limits_bench.py [--number N] [--repeat R] [--redis URL]``.

For each strategy (fixed window, moving window, sliding window counter) a limiter of
``limits`` hits one key ``N`` times per sample, in one process, on each storage in
turn (interleaved, so each sees the same machine load); the best of ``R`` samples per
storage is the cost of one hit, in microseconds, and the ratio to ``memory://`` is
printed beside it. The limit is high enough that every hit is admitted (the common
case a web worker pays). ``--redis`` adds a Redis server's ``redis://`` URL.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from functools import partial

import limits
from limits import strategies
from limits.storage import storage_from_string

import orbitive.limits  # noqa: F401 - registers shm://
from orbitive._core._region import object_name, unlink_object
from orbitive.limits._layout import RATE_KIND

STRATEGIES: dict[str, type[strategies.RateLimiter]] = {
    "fixed window": strategies.FixedWindowRateLimiter,
    "moving window": strategies.MovingWindowRateLimiter,
    "sliding window": strategies.SlidingWindowCounterRateLimiter,
}


def _sample(hit: Callable[[], bool], number: int) -> float:
    """Microseconds per hit over ``number`` hits."""
    start = time.perf_counter()
    for _ in range(number):
        hit()
    return (time.perf_counter() - start) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20000, help="hits per sample")
    parser.add_argument("--repeat", type=int, default=7, help="samples per storage")
    parser.add_argument("--redis", default=None, help="a redis:// URL to compare too")
    args = parser.parse_args()
    fleet = f"bench-limits-{os.getpid()}"
    urls = {"memory://": "memory://", "shm://": f"shm://{fleet}?capacity=1024&window=128"}
    if args.redis:
        urls["redis://"] = args.redis
    # A moving window keeps every hit's timestamp: the limit must be within the table's
    # window (128 timestamps), so its hits keep it near full; fixed and sliding windows
    # count up to a limit no sample reaches.
    items = {
        "fixed window": limits.parse("1000000000/hour"),
        "moving window": limits.parse("128/second"),
        "sliding window": limits.parse("1000000000/hour"),
    }
    try:
        print(f"limits {limits.__version__}, {args.number} hits per sample, best of {args.repeat}")
        for name, limiter_type in STRATEGIES.items():
            item = items[name]
            limiters = {
                label: limiter_type(storage_from_string(url)) for label, url in urls.items()
            }
            best = {label: float("inf") for label in urls}
            for _ in range(args.repeat):
                for label, limiter in limiters.items():
                    cost = _sample(partial(limiter.hit, item, "bench"), args.number)
                    best[label] = min(best[label], cost)
            base = best["memory://"]
            row = "  ".join(
                f"{label} {cost:6.2f} us ({cost / base:4.2f}x)" for label, cost in best.items()
            )
            print(f"{name:15} {row}")
    finally:
        unlink_object(object_name(fleet, RATE_KIND))


if __name__ == "__main__":
    main()
