"""The README's first example in a container's ``/dev/shm`` (issue 35, items 1 to 3).

Docker and Kubernetes give a container 64 MB of ``/dev/shm``. Each test runs in a
private mount namespace with a ``/dev/shm`` of the size a container would have: the
README's first lease example (read from README.md itself) runs there with room to
spare, and a ``/dev/shm`` too small for a lock table gives :class:`orbitive.ShmFull`,
whose message says what to do, and leaves none of the table's objects behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from orbitive._core._fleet import CAPACITY_DEFAULT
from orbitive._core._section import object_bytes
from orbitive.lock import LockLayout

from ._site import ROOT, blocks
from .test_site_examples import _unshare

#: Mounts a tmpfs of the size given first at ``/dev/shm``, then runs the rest.
_SIZED_SHM = 'mount -t tmpfs -o "mode=1777,size=$0" orbitive-shm /dev/shm && exec "$@"'
#: Prints what the program left in ``/dev/shm``: every name with its bytes, and the used bytes.
_REPORT = """
import json as _json, os as _os
_found = _os.statvfs("/dev/shm")
print(_json.dumps({
    "names": {e.name: e.stat().st_size for e in _os.scandir("/dev/shm")},
    "used": (_found.f_blocks - _found.f_bfree) * _found.f_frsize,
}))
"""
MB = 1 << 20


def _in_shm(size: str, code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by this interpreter with a private ``/dev/shm`` of ``size`` (``64m``)."""
    prefix = _unshare()
    if prefix is None:
        message = "needs a private mount namespace (unshare -m as root, or unshare -Urm)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    env = {key: value for key, value in os.environ.items() if not key.startswith("ORBIT_")}
    argv = [*prefix, "sh", "-c", _SIZED_SHM, size, sys.executable, "-c", code]
    return subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _left(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    report: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return report


def _first_example() -> str:
    """The README's first Python block: the keyed-lease example."""
    return next(block.code for block in blocks(ROOT / "README.md") if block.language == "python")


def test_the_readme_first_example_runs_in_a_64_mb_dev_shm_with_room_to_spare() -> None:
    code = _first_example()
    assert 'Fleet.join("web")' in code and "LockTable(fleet)" in code  # the example meant
    done = _in_shm("64m", code + _REPORT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "mine, fencing token 1" in done.stdout
    left = _left(done)
    # The lock table's state, its ring of 32 frames per node and the membership object:
    # 2.5 MB at the default 64 nodes (1024 frames took 71.6 MB and failed here).
    assert sorted(left["names"]) == [  # type: ignore[call-overload]
        "orbit-web-228-0",
        "orbit-web-229-0",
        "orbit-web-members-0",
    ]
    assert left["used"] < 3 * MB  # type: ignore[operator]


def test_every_default_object_of_a_fleet_fits_in_a_64_mb_dev_shm() -> None:
    code = """
from orbitive import Fleet
from orbitive.lock import LockTable
from orbitive.pool import Pool
from orbitive.store import open_store

fleet = Fleet.join("web")
table, pool = LockTable(fleet), Pool(fleet)
with open_store("shm://web") as store, store.lock("jobs/nightly", ttl=30.0):
    pass
"""
    done = _in_shm("64m", code + _REPORT)
    assert done.returncode == 0, done.stdout + done.stderr
    left = _left(done)
    # lock table 2.5 MB, shm:// store 0.8 MB, pool 7.2 MB: 10.5 MB of 64.
    assert len(left["names"]) == 6, left  # type: ignore[arg-type]
    assert left["used"] < 11 * MB  # type: ignore[operator]


_TOO_SMALL = """
from orbitive import Fleet, ShmFull
from orbitive.lock import LockLayout, LockTable

fleet = Fleet.join("web")
try:
    LockTable(fleet{layout})
except ShmFull as error:
    print(error)
else:
    raise SystemExit("the table was made")
"""


def _table_bytes(layout: LockLayout) -> int:
    """Bytes of a new table's two objects at the default 64 nodes."""
    ring = layout.ring_geometry(CAPACITY_DEFAULT).size
    return object_bytes(layout.state_size) + object_bytes(ring)


@pytest.mark.parametrize(
    ("size", "ring"),
    [("1m", None), ("64m", 1 << 14)],  # the default table in 1 MB; a ring too large for 64 MB
)
def test_a_dev_shm_too_small_for_a_table_says_what_to_do_and_leaves_nothing(
    size: str, ring: int | None
) -> None:
    layout = "" if ring is None else f", LockLayout(ring_capacity={ring})"
    asked = _table_bytes(LockLayout() if ring is None else LockLayout(ring_capacity=ring))
    done = _in_shm(size, _TOO_SMALL.format(layout=layout) + _REPORT)
    assert done.returncode == 0, done.stdout + done.stderr
    message = done.stdout.splitlines()[0]
    assert "'orbit-web-228-0' and 'orbit-web-229-0'" in message
    assert f"no space for {asked:,} bytes in /dev/shm" in message
    free = int(message.split(" bytes free")[0].rsplit(", ", 1)[1].replace(",", ""))
    assert 0 < free <= {"1m": 1, "64m": 64}[size] * MB
    for fix in ("capacity=N", "LockLayout(ring_capacity=N)", "--shm-size", "medium: Memory"):
        assert fix in message, fix
    # Neither of the table's objects is left; the fleet the program joined still has its
    # membership object, as any fleet does.
    assert list(_left(done)["names"]) == ["orbit-web-members-0"]  # type: ignore[call-overload]


_HALF_MADE = """
from orbitive import Fleet, ShmFull

def init(buf):
    buf[0] = 1

def valid(buf):
    pass

fleet = Fleet.join("web", capacity=4)
try:
    # The check before the block counts the small object only: the large one is
    # refused by posix_fallocate once the small one exists.
    with fleet.creating([(200, 4096)]):
        fleet.region(200, 4096, init, valid)
        fleet.region(201, 2 << 20, init, valid)
except ShmFull as error:
    print(error)
else:
    raise SystemExit("both were made")
"""


def test_an_object_made_before_another_does_not_fit_is_unlinked() -> None:
    done = _in_shm("1m", _HALF_MADE + _REPORT)
    assert done.returncode == 0, done.stdout + done.stderr
    message = done.stdout.splitlines()[0]
    assert "'orbit-web-201-0': no space for 2,101,248 bytes" in message, message
    assert "(No space left on device)" in message and "--shm-size" in message
    assert list(_left(done)["names"]) == ["orbit-web-members-0"]  # type: ignore[call-overload]
