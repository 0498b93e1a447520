"""The two critical-section mechanisms side by side: a robust mutex or flock, in one run.

Run: ``.venv/bin/python bench/section_bench.py [--pairs N] [--repeats R]``. Each row
is the median microseconds per lock + unlock pair over R runs of N pairs:

* the section alone, the way a step takes it from Python: the robust mutex through
  its C twin and through ctypes, and ``flock`` on the object's own descriptor;
* ``Region.acquire`` + ``release`` on an object of each mechanism (the process
  mutex in front of the section);
* a whole ``LockTable`` try_acquire + release on a table of each mechanism (with
  the robust mutex the C operations take the section themselves; with flock the
  Python operations run).

``x flock`` divides by the bare flock pair of the same run. The mechanism a new
object records is the robust mutex (``_section.py`` says why).
"""

from __future__ import annotations

import argparse
import fcntl
import mmap
import os
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.lock_bench import per_pair_us as samples_us
from orbitive import Fleet
from orbitive._core import _robust, _section

try:
    from orbitive._core import _robust_c
except ImportError:  # not built: the ctypes twin only
    _robust_c = None  # type: ignore[assignment, unused-ignore]
from orbitive._core._region import Region
from orbitive.cli import main as orbit
from orbitive.lock import Acquired, LockKey, LockOwner, LockTable

KIND = 203


def per_pair_us(run: Callable[[int], None], pairs: int, repeats: int) -> float:
    """Median microseconds per pair over ``repeats`` timed runs of ``pairs`` pairs."""
    return statistics.median(samples_us(run, pairs, repeats))


def pairs_of(acquire: Callable[[], object], release: Callable[[], object]) -> Callable[[int], None]:
    def run(pairs: int) -> None:
        for _ in range(pairs):
            acquire()
            release()

    return run


@contextmanager
def fleet_with(mechanism: str) -> Iterator[tuple[Region, LockTable]]:
    """A region and a lock table whose objects record ``mechanism`` ("mutex" or "flock")."""
    fleet = Fleet.join(f"bench-section-{mechanism}-{os.getpid()}", capacity=4)
    os.environ["ORBIT_SECTION"] = mechanism
    try:
        region = fleet.region(KIND, mmap.PAGESIZE, lambda buf: None, lambda buf: None)
        table = LockTable(fleet)
    finally:
        del os.environ["ORBIT_SECTION"]
    try:
        yield region, table
    finally:
        fleet.close()
        orbit(["clear", fleet.name, "--all", "--yes"])


def table_pairs(table: LockTable) -> Callable[[int], None]:
    key, owner = LockKey("bench", "key"), LockOwner(b"bench-owner")
    acquire, release = table.try_acquire, table.release

    def run(pairs: int) -> None:
        for _ in range(pairs):
            result = acquire(key, owner, 30.0)
            assert isinstance(result, Acquired)
            release(result.lease)

    return run


def rows(pairs: int, repeats: int) -> list[tuple[str, float]]:
    found = []
    with (
        fleet_with("mutex") as (mutex_region, mutex_table),
        fleet_with("flock") as (
            flock_region,
            flock_table,
        ),
    ):
        flock_section = flock_region.section
        assert isinstance(flock_section, _section.FlockSection)
        fd = flock_section.fd
        bare = pairs_of(
            lambda: fcntl.flock(fd, fcntl.LOCK_EX), lambda: fcntl.flock(fd, fcntl.LOCK_UN)
        )
        found.append(("flock pair on the object's descriptor", per_pair_us(bare, pairs, repeats)))
        twins: list[tuple[str, Callable[[mmap.mmap], _section.Mutex]]] = [
            ("robust mutex, ctypes twin", _robust.RobustMutex)
        ]
        if _robust_c is not None:
            twins.insert(0, ("robust mutex, C twin", _robust_c.RobustMutex))
        for name, twin in twins:
            mutex = twin(mutex_region.block)
            found.append(
                (name, per_pair_us(pairs_of(mutex.acquire, mutex.release), pairs, repeats))
            )
        for name, region in (("mutex", mutex_region), ("flock", flock_region)):
            run = pairs_of(region.acquire, region.release)
            found.append((f"Region.acquire + release, {name}", per_pair_us(run, pairs, repeats)))
        for name, table in (("mutex", mutex_table), ("flock", flock_table)):
            run = table_pairs(table)
            found.append(
                (f"LockTable try_acquire + release, {name}", per_pair_us(run, pairs, repeats))
            )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    found = rows(args.pairs, args.repeats)
    floor = found[0][1]
    for name, us in found:
        print(f"{name:<42} {us:7.3f} us  x flock {us / floor:5.2f}")


if __name__ == "__main__":
    main()
