"""What one ``limits`` hit costs on ``shm://`` against ``memory://`` (issue 33).

Run: ``.venv/bin/python bench/limits_bench.py [--number N] [--repeat R] [--redis URL]``.

For each strategy (fixed window, moving window admitting and refusing, sliding window
counter) a limiter of ``limits`` hits ``N`` times per sample (see :data:`VARIANTS`), in
one process, on each storage in turn (interleaved, so each sees the same machine load);
the best of ``R`` samples per storage is the cost of one hit, in microseconds, and the
ratio to ``memory://`` is printed beside it. ``--redis`` adds a Redis server's
``redis://`` URL.
"""

from __future__ import annotations

import argparse
import os
import time
from itertools import count

import limits
from limits import strategies
from limits.storage import storage_from_string

import orbitive.limits  # noqa: F401 - registers shm://
from orbitive._core._fleet import members_name
from orbitive._core._region import object_name, unlink_object
from orbitive.limits._layout import RATE_KIND
from orbitive.limits._shm_storage import close_tables

#: (name, limiter, limit, keys hit in turn): the fixed and sliding windows count up to a
#: limit no sample reaches; the moving window is measured admitting (200 fresh keys per
#: sample, each hit at most 100 times, below its 128 a second) and refusing (one key,
#: full after its first 128 hits of the second).
VARIANTS: list[tuple[str, type[strategies.RateLimiter], str, int]] = [
    ("fixed window", strategies.FixedWindowRateLimiter, "1000000000/hour", 1),
    ("moving, admitted", strategies.MovingWindowRateLimiter, "128/second", 200),
    ("moving, refused", strategies.MovingWindowRateLimiter, "128/second", 1),
    ("sliding window", strategies.SlidingWindowCounterRateLimiter, "1000000000/hour", 1),
]
_samples = count()


def _sample(
    limiter: strategies.RateLimiter, item: limits.RateLimitItem, keys: int, number: int
) -> float:
    """Microseconds per hit over ``number`` hits spread over ``keys`` keys new to this sample
    (one key: the same key every sample)."""
    tag = next(_samples) if keys > 1 else 0
    names = [f"bench-{tag}-{key}" for key in range(keys)]
    turns = [names[index % keys] for index in range(number)]
    hit = limiter.hit
    start = time.perf_counter()
    for name in turns:
        hit(item, name)
    return (time.perf_counter() - start) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=20000, help="hits per sample")
    parser.add_argument("--repeat", type=int, default=7, help="samples per storage")
    parser.add_argument("--redis", default=None, help="a redis:// URL to compare too")
    args = parser.parse_args()
    fleet = f"bench-limits-{os.getpid()}"
    # Room for every moving-window key a second of samples makes.
    urls = {"memory://": "memory://", "shm://": f"shm://{fleet}?capacity=1024&windows=8192"}
    if args.redis:
        urls["redis://"] = args.redis
    try:
        print(f"limits {limits.__version__}, {args.number} hits per sample, best of {args.repeat}")
        for name, limiter_type, text, keys in VARIANTS:
            item = limits.parse(text)
            limiters = {
                label: limiter_type(storage_from_string(url)) for label, url in urls.items()
            }
            best = {label: float("inf") for label in urls}
            for _ in range(args.repeat):
                for label, limiter in limiters.items():
                    cost = _sample(limiter, item, keys, args.number)
                    best[label] = min(best[label], cost)
            base = best["memory://"]
            row = "  ".join(
                f"{label} {cost:6.2f} us ({cost / base:4.2f}x)" for label, cost in best.items()
            )
            print(f"{name:17} {row}")
    finally:
        close_tables()  # leave the fleet, then remove its table and membership object
        unlink_object(object_name(fleet, RATE_KIND))
        unlink_object(members_name(fleet))


if __name__ == "__main__":
    main()
