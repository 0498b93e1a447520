"""A new user's first minutes with an installed orbitive, run by that installation's interpreter.

``python -I _smoke.py FLEET`` (from a folder outside the repository, so that
``orbitive`` is the installed one) imports orbitive and its C modules, takes a key
of fleet FLEET's lock table, has a second process find the key held, releases it,
has a third process take it, and prints one JSON object (:class:`SmokeReport`).
``python -I _smoke.py FLEET --contend`` is the other processes' part: one
``try_acquire`` of the key (released at once when acquired), printing "acquired" or
"occupied". The script imports nothing from the test suite.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from typing import TypedDict

import orbitive
from orbitive import Fleet
from orbitive.lock import Acquired, LockKey, LockOwner, LockTable, Occupied

# The C modules of the core setup.py builds; each has a Python twin that runs when it is
# missing. The wheel also carries orbitive.limits._fastpath, which imports only with the
# limits extra (test_artifacts checks it is there).
C_MODULES = ("orbitive._core._robust_c", "orbitive.lock._fastpath", "orbitive.pool._fastpath")
CAPACITY = 4
KEY = LockKey("smoke", "first-minutes")
TTL = 30.0


class SmokeReport(TypedDict):
    """What the smoke check saw: where orbitive came from, its C modules, the lock's outcomes."""

    module_file: str
    version: str
    c_modules: dict[str, bool]
    while_held: str
    released: bool
    after_release: str


def loads(module: str) -> bool:
    """True when ``module`` imports (an extension module built for this interpreter and libc)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def contend(fleet_name: str) -> str:
    """One attempt at the key from this process: "acquired" (then released) or "occupied"."""
    with Fleet.join(fleet_name, CAPACITY) as fleet:
        table = LockTable(fleet)
        try:
            match table.try_acquire(KEY, LockOwner.random(), TTL):
                case Acquired(lease):
                    table.release(lease)
                    return "acquired"
                case Occupied():
                    return "occupied"
        finally:
            table.close()
    raise AssertionError("try_acquire returned neither Acquired nor Occupied")


def contend_in_another_process(fleet_name: str) -> str:
    """Run :func:`contend` in a new interpreter of this installation; its answer."""
    done = subprocess.run(
        [sys.executable, "-I", __file__, fleet_name, "--contend"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def smoke(fleet_name: str) -> SmokeReport:
    """Hold the key while another process tries it, release it, let a third take it."""
    with Fleet.join(fleet_name, CAPACITY) as fleet:
        table = LockTable(fleet)
        try:
            outcome = table.try_acquire(KEY, LockOwner.random(), TTL)
            assert isinstance(outcome, Acquired), outcome
            while_held = contend_in_another_process(fleet_name)
            released = table.release(outcome.lease)
            after_release = contend_in_another_process(fleet_name)
        finally:
            table.close()
    return SmokeReport(
        module_file=str(orbitive.__file__),
        version=orbitive.__version__,
        c_modules={module: loads(module) for module in C_MODULES},
        while_held=while_held,
        released=released,
        after_release=after_release,
    )


def main(argv: list[str]) -> None:
    """``_smoke.py FLEET`` prints the report; ``_smoke.py FLEET --contend`` one attempt."""
    match argv:
        case [fleet_name]:
            print(json.dumps(smoke(fleet_name)))
        case [fleet_name, "--contend"]:
            print(contend(fleet_name))
        case _:
            raise SystemExit("usage: _smoke.py FLEET [--contend]")


if __name__ == "__main__":
    main(sys.argv[1:])
