"""A fleet member run as its own program, in whatever environment the test gives it.

Usage: ``python _env_member.py FLEET CAPACITY``. Prints ``node N``, then answers
each line on stdin: ``go R`` tries the key once (prints ``R acquired`` or
``R busy``), ``release R`` releases what round R acquired (prints ``R released``
or ``R lost``), ``stop`` exits. Imports nothing of the tests, so it runs with no
environment at all (``env -i``).
"""

from __future__ import annotations

import os
import sys

from orbitive import Fleet
from orbitive.lock import Acquired, LockKey, LockLease, LockOwner, LockTable

KEY = LockKey("tests.environments", "one-holder")


def main() -> None:
    fleet = Fleet.join(sys.argv[1], int(sys.argv[2]))
    table = LockTable(fleet)
    owner = LockOwner(f"pid-{os.getpid()}")
    print(f"node {fleet.node}", flush=True)
    held: dict[str, LockLease] = {}
    for line in sys.stdin:
        command, _, round_ = line.strip().partition(" ")
        if command == "go":
            result = table.try_acquire(KEY, owner, 30.0)
            if isinstance(result, Acquired):
                held[round_] = result.lease
            print(f"{round_} {'acquired' if isinstance(result, Acquired) else 'busy'}", flush=True)
        elif command == "release":
            released = table.release(held.pop(round_))
            print(f"{round_} {'released' if released else 'lost'}", flush=True)
        else:
            break
    table.close()
    fleet.close()


if __name__ == "__main__":
    main()
