"""Processes of different environments and section choices create one fleet at the same moment.

Half of them ask for ``ORBIT_SECTION=flock``, half leave it unset (the robust
mutex); their XDG_RUNTIME_DIR, TMPDIR, HOME and working folder differ, one has no
environment at all. All must end on the same objects (same inodes) with one
mechanism per object, and none may meet a half-written object.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from .._fleets import new_fleet_name, remove_fleet_files
from .test_environments import environments

CREATOR = Path(__file__).with_name("_race_creator.py")
ROUNDS = 2
#: Seconds from now at which every creator starts: enough for each interpreter to load.
LEAD = 1.5


def race(fleet: str, tmp_path: Path) -> list[list[str]]:
    """Every creator's report lines for one simultaneous start."""
    start = time.time() + LEAD
    settings = []
    for env, folder in environments(tmp_path):
        settings.append(({**env, "ORBIT_SECTION": "flock"} if env else env, folder))
        settings.append(({k: v for k, v in env.items() if k != "ORBIT_SECTION"}, folder))
    creators = [
        subprocess.Popen(
            [sys.executable, str(CREATOR), fleet, repr(start)],
            env=env,
            cwd=folder,
            stdout=subprocess.PIPE,
            text=True,
        )
        for env, folder in settings
    ]
    return [creator.communicate(timeout=60)[0].splitlines() for creator in creators]


def test_creators_racing_in_every_environment_agree_on_each_object_and_mechanism(
    tmp_path: Path,
) -> None:
    for _ in range(ROUNDS):
        fleet = new_fleet_name()
        try:
            reports = race(fleet, tmp_path)
        finally:
            remove_fleet_files(fleet)
        first = reports[0]
        assert len(first) == 3, first
        assert all(report == first for report in reports), reports
        assert {line.split()[2] for line in first[1:]} <= {"1", "2"}
