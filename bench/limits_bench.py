"""What one ``limits`` hit costs on each storage, against ``memory://`` (issue 33).

Run from the repository root: ``.venv/bin/python bench/limits_bench.py [--quick]
[--postgres URL] [--out DIR]``. In one process, a ``limits`` strategy hits a limit
of 100 per minute (``FixedWindowRateLimiter.hit``, ``MovingWindowRateLimiter.hit``)
on each storage:

* ``memory://``, the default of flask-limiter and slowapi: one process's dict, the
  floor every ratio is taken against (``x floor``);
* ``shm://`` (orbitive.limits), a fresh fleet's rate-limit table, removed after;
* ``redis://``, a throw-away ``redis-server`` on loopback (``tests/_servers.py``);
* ``postgresql://`` (orbitive.limits), only when ``--postgres URL`` is given.

Two groups: one key, hit over and over (a client far over its limit: after the
warm-up every hit is refused, so it times the refusal), and 1,000 keys hit in turn
(1,000 clients within their limits: every hit is admitted, so it times the
counting). The storages take turns batch by batch (after a warm-up of each), so all
see the same machine load; each sample is the mean over one batch, and a row shows
the median and the spread of its samples. A storage that cannot run here (no
``redis-server``, a scheme not registered) is a skipped row with the reason.

It prints the table and writes ``results.json`` (every sample, the medians, the
ratios) and ``results.md`` (the table) into ``--out``, if given.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from limits import RateLimitItem, parse, strategies
from limits.errors import ConfigurationError
from limits.storage import storage_from_string

import orbitive.limits  # noqa: F401 - registers shm:// (and postgresql://) with limits
from bench._measure import Kind, Result, Skip
from bench._report import markdown, print_table, write_json
from tests._fleets import remove_fleet_files
from tests._servers import ServerUnavailable, TempRedis

LIMIT: Final = "100/minute"
STRATEGIES: Final[dict[str, type[strategies.RateLimiter]]] = {
    "fixed-window": strategies.FixedWindowRateLimiter,
    "moving-window": strategies.MovingWindowRateLimiter,
}
#: Keys of each group; 1,000 keys take (batch x samples + warm-up) / 1,000 hits each,
#: under the limit of 100 so that every one is admitted.
GROUPS: Final = {"1 key": 1, "1,000 keys": 1000}
#: (hits per batch, samples per row) of a full run and of a quick one.
FULL: Final = (3000, 7)
QUICK: Final = (200, 3)
#: The shm:// table's geometry: counters and moving-window slots for every key, twice over.
SHM_SIZES: Final = "capacity=4096&windows=2048"

Hit = Callable[[], bool]


@contextlib.contextmanager
def storages(postgres: str | None) -> Iterator[dict[str, tuple[Kind, str | Skip]]]:
    """Each storage's row kind and URL (or why it cannot run), its server and fleet
    removed when the block ends."""
    fleet = f"benchlimits{os.getpid()}"
    found: dict[str, tuple[Kind, str | Skip]] = {
        "memory://": ("floor", "memory://"),
        "shm://": ("orbitive", f"shm://{fleet}?{SHM_SIZES}"),
    }
    with contextlib.ExitStack() as stack:
        stack.callback(remove_fleet_files, fleet)
        try:
            redis_server = TempRedis.start()
        except ServerUnavailable as error:
            found["redis://"] = ("alternative", Skip(str(error)))
        else:
            stack.callback(redis_server.stop)
            found["redis://"] = ("alternative", redis_server.url)
        found["postgresql://"] = (
            "alternative",
            postgres if postgres is not None else Skip("no --postgres URL given"),
        )
        yield found


def _hitter(limiter: strategies.RateLimiter, item: RateLimitItem, strategy: str, keys: int) -> Hit:
    """One hit per call, on the group's keys in turn (keys named after the strategy: the
    two keep different records under one key on a storage)."""
    names = [f"{strategy}-{keys}-{index}" for index in range(keys)]
    turn = iter(range(1 << 62))
    hit = limiter.hit

    def one() -> bool:
        return hit(item, names[next(turn) % keys])

    return one


def measure(
    rows: dict[str, Hit], batch: int, samples: int
) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Microseconds per hit, one sample per batch, the rows taking turns batch by batch
    (after a warm-up batch of each); and how many timed hits each row's limit admitted."""
    for hit in rows.values():
        for _ in range(batch):
            hit()
    times: dict[str, list[float]] = {name: [] for name in rows}
    admitted = dict.fromkeys(rows, 0)
    clock = time.perf_counter
    for _ in range(samples):
        for name, hit in rows.items():
            passed = 0
            started = clock()
            for _ in range(batch):
                passed += hit()
            times[name].append((clock() - started) / batch * 1e6)
            admitted[name] += passed
    return times, admitted


def run(postgres: str | None, batch: int, samples: int) -> list[Result]:
    """Every (strategy, group) with each storage: a result per row."""
    item = parse(LIMIT)
    results: list[Result] = []
    with storages(postgres) as found:
        for strategy, limiter_class in STRATEGIES.items():
            for group, keys in GROUPS.items():
                section = f"limits {strategy} hit ({LIMIT})"
                rows: dict[str, Hit] = {}
                for name, (kind, url) in found.items():
                    result = Result(section, group, name, kind, "us")
                    results.append(result)
                    try:
                        if isinstance(url, Skip):
                            raise url
                        limiter = limiter_class(storage_from_string(url))
                    except (Skip, ConfigurationError) as error:
                        result.skipped = str(error) or type(error).__name__
                        continue
                    rows[name] = _hitter(limiter, item, strategy, keys)
                times, admitted = measure(rows, batch, samples)
                for result in results[-len(found) :]:
                    if result.name in times:
                        result.samples = times[result.name]
                        result.extra["admitted_share"] = admitted[result.name] / (batch * samples)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    parser.add_argument("--postgres", metavar="URL", help="add postgresql:// at this URL")
    parser.add_argument("--out", type=Path, help="write results.json and results.md here")
    args = parser.parse_args()
    batch, samples = QUICK if args.quick else FULL
    results = run(args.postgres, batch, samples)
    print_table(results)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        command = " ".join(["bench/limits_bench.py", *sys.argv[1:]])
        meta = {"command": command, "mode": "quick" if args.quick else "full", "limit": LIMIT}
        write_json(args.out / "results.json", results, meta)
        (args.out / "results.md").write_text(markdown(results), encoding="utf-8")


if __name__ == "__main__":
    main()
