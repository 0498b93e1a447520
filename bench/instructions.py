"""User-space instructions per operation, counted by callgrind (repeatable on a noisy VM).

Run: ``.venv/bin/python bench/instructions.py [--count N]``. For each workload it
runs this script under ``valgrind --tool=callgrind`` twice, with 0 and with N
operations after the same set-up, and prints (total(N) - total(0)) / N: the
instructions one operation costs, set-up and interpreter start excluded.
System calls count as the instructions of their user-space side only.

Workloads: ``flock`` (a bare ``fcntl.flock`` lock + unlock pair from Python, the
floor), ``lock`` (``LockTable.try_acquire`` + ``release``), ``section``
(``Region.acquire`` + ``release`` on the robust mutex), ``pool`` (the pool's
local reuse cycle, ``reserve`` + ``accept`` + ``complete``) and ``clients`` (a
``ClientPool`` checkout + return of an idle local client), and on the ``shm://`` store
of the same fleet ``store`` (``try_lock`` + ``release``), ``semaphore``
(``semaphore.try_acquire`` + ``release``, limit 5, nobody else holding it),
``store-with`` (``with store.lock(name, ttl=30, timeout=10)``: the blocking helper,
renewed by the process's renewer) and ``store-bare`` (the same with
``auto_renew=False``).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from orbitive import Fleet
from orbitive.lock import Acquired, LockKey, LockOwner, LockTable

WORKLOADS = (
    "flock",
    "lock",
    "section",
    "pool",
    "clients",
    "store",
    "semaphore",
    "store-with",
    "store-bare",
)
_COLLECTED = re.compile(r"Collected : (\d+)")


def _flock(fleet: Fleet) -> Callable[[], None]:
    fd = os.open(tempfile.mkstemp()[1], os.O_RDWR)

    def pair() -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        fcntl.flock(fd, fcntl.LOCK_UN)

    return pair


def _section(fleet: Fleet) -> Callable[[], None]:
    region = LockTable(fleet)._state

    def section() -> None:
        region.acquire()
        region.release()

    return section


def _lock(fleet: Fleet) -> Callable[[], None]:
    table = LockTable(fleet)
    key, owner = LockKey("bench", "key"), LockOwner(b"bench-owner")
    acquire, release = table.try_acquire, table.release

    def lock() -> None:
        result = acquire(key, owner, 30.0)
        assert isinstance(result, Acquired)
        release(result.lease)

    return lock


def _pool(fleet: Fleet) -> Callable[[], None]:
    from orbitive.pool import Key, Pool  # noqa: PLC0415 - only this workload needs it

    pool = Pool(fleet)
    rid = pool.register(Key(0xB0B), 1)
    reserve, accept = pool.reserve, pool.accept

    def cycle() -> None:
        accept(reserve(rid)).complete()

    return cycle


def _clients(fleet: Fleet) -> Callable[[], None]:
    from orbitive.clients import ClientPool  # noqa: PLC0415 - only this workload needs it

    pool: ClientPool[object] = ClientPool(fleet, "bench", create=object, close=lambda c: None)
    getconn, putconn = pool.getconn, pool.putconn

    def checkout() -> None:
        putconn(getconn())

    return checkout


def _store(fleet: Fleet) -> Callable[[], None]:
    from orbitive.store import open_store  # noqa: PLC0415 - only these workloads need it

    try_lock = open_store(f"shm://{fleet.name}").try_lock

    def pair() -> None:
        lock = try_lock("bench/key", "bench-owner", 30.0)
        assert lock is not None
        lock.release()

    return pair


def _semaphore(fleet: Fleet) -> Callable[[], None]:
    from orbitive.store import open_store  # noqa: PLC0415 - only these workloads need it

    try_acquire = open_store(f"shm://{fleet.name}").semaphore("bench/key", 5).try_acquire

    def pair() -> None:
        lease = try_acquire("bench-owner", 30.0)
        assert lease is not None
        lease.release()

    return pair


def _store_with(fleet: Fleet) -> Callable[[], None]:
    from orbitive.store import open_store  # noqa: PLC0415 - only these workloads need it

    lock = open_store(f"shm://{fleet.name}").lock

    def held() -> None:
        with lock("bench/key", ttl=30.0, timeout=10.0):
            pass

    return held


def _store_bare(fleet: Fleet) -> Callable[[], None]:
    from orbitive.store import open_store  # noqa: PLC0415 - only these workloads need it

    lock = open_store(f"shm://{fleet.name}").lock

    def held() -> None:
        with lock("bench/key", "bench-owner", ttl=30.0, timeout=10.0, auto_renew=False):
            pass

    return held


#: One warmed-up operation of each workload on a fleet.
PREPARE: dict[str, Callable[[Fleet], Callable[[], None]]] = {
    "flock": _flock,
    "lock": _lock,
    "section": _section,
    "pool": _pool,
    "clients": _clients,
    "store": _store,
    "semaphore": _semaphore,
    "store-with": _store_with,
    "store-bare": _store_bare,
}


def _run_child(workload: str, count: int, fleet_name: str) -> None:
    fleet = Fleet.join(fleet_name, 4)
    operation = PREPARE[workload](fleet)
    for _ in range(100):
        operation()
    for _ in range(count):
        operation()


def _instructions(workload: str, count: int, fleet_name: str) -> int:
    done = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--callgrind-out-file=/dev/null",
            sys.executable,
            __file__,
            "--child",
            workload,
            str(count),
            fleet_name,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    found = _COLLECTED.search(done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no total:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=5000, help="operations per counted run")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=WORKLOADS, action="append", help="these workloads")
    args = parser.parse_args()
    if args.child:
        workload, count, fleet_name = args.child
        _run_child(workload, int(count), fleet_name)
        return
    if shutil.which("valgrind") is None:
        sys.exit("bench/instructions.py needs valgrind (apt-get install valgrind)")
    fleet_name = f"bench-instr-{os.getpid()}"
    try:
        for workload in args.only or WORKLOADS:
            base = _instructions(workload, 0, fleet_name)
            total = _instructions(workload, args.count, fleet_name)
            print(
                f"{workload:<10} {(total - base) / args.count:>10,.0f} instructions per operation"
            )
    finally:
        for path in Path("/dev/shm").glob(f"orbit-{fleet_name}-*"):
            path.unlink()


if __name__ == "__main__":
    main()
