"""Create (or attach) a fleet's objects at a given moment, in whatever environment it is given.

Usage: ``python _race_creator.py FLEET START``: waits until ``time.time()`` is
START, joins the fleet, opens its lock table, then prints one line per object:
``NAME INODE MECHANISM`` (``-`` for the membership object), or the name of the
OrbitError it met. Imports nothing of the tests, so it runs with no environment.
"""

from __future__ import annotations

import os
import sys
import time

from orbitive import Fleet, OrbitError
from orbitive._core._fleet import members_name
from orbitive._core._region import SHM_DIR
from orbitive.lock import LockTable


def main() -> None:
    time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
    try:
        fleet = Fleet.join(sys.argv[1], 8)
        table = LockTable(fleet)
    except OrbitError as error:
        print(type(error).__name__, error, flush=True)
        return
    regions = [table._state, table._ring.region]
    members = os.stat(SHM_DIR / members_name(fleet.name)).st_ino
    print(f"{members_name(fleet.name)} {members} -")
    for region in regions:
        assert region.section is not None
        print(f"{region.name} {os.stat(SHM_DIR / region.name).st_ino} {region.section.mechanism}")
    table.close()
    fleet.close()


if __name__ == "__main__":
    main()
