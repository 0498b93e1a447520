"""The table's bytes: every header field is checked on attach; geometry is validated."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from orbitive import Fleet, InvalidCapacity
from orbitive._core._errors import LayoutMismatch, MalformedError
from orbitive._core._region import SHM_DIR, object_name
from orbitive.pool import POOL_KIND, Key, Pool
from orbitive.pool._layout import HEADER_SIZE, RES_HOT, RES_LEASE, Layout, check_capacity

from .._processes import Processes
from ._geometry import geometry_after_environment_change
from .conftest import CAPACITY


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)[0]
        handle.seek(offset)
        handle.write(bytes([byte ^ 0x5A]))


def test_every_corrupt_header_byte_is_refused_with_layout_mismatch(fleet_name: str) -> None:
    with Fleet.join(fleet_name, CAPACITY) as fleet, Pool(fleet) as pool:
        pool.register(Key(1), 1)
    path = str(SHM_DIR / object_name(fleet_name, POOL_KIND))
    for offset in range(HEADER_SIZE):
        _flip(path, offset)
        with Fleet.join(fleet_name, CAPACITY) as fleet, pytest.raises(LayoutMismatch):
            Pool(fleet)
        _flip(path, offset)  # restore
    with Fleet.join(fleet_name, CAPACITY) as fleet, Pool(fleet) as pool:
        assert len(pool.candidates(Key(1))) == 1  # the restored table is intact


def test_the_lease_steps_read_the_resource_fields_where_the_slot_has_them() -> None:
    fields = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)  # RES_HOT order, state .. epoch
    slot = RES_HOT.pack(*fields)
    state, node, generation, life, _, _, capacity, index, active, fence, _, epoch = fields
    expected = (state, node, generation, life, capacity, index, active, fence, epoch)
    assert RES_LEASE.unpack_from(slot) == expected


def test_another_geometry_or_fleet_capacity_is_refused(fleet_name: str) -> None:
    with Fleet.join(fleet_name, CAPACITY) as fleet, Pool(fleet):
        with Fleet.join(fleet_name, CAPACITY) as other, pytest.raises(LayoutMismatch):
            Pool(other, key_capacity=64)
        with pytest.raises(InvalidCapacity):  # the fleet itself refuses another capacity
            Fleet.join(fleet_name, CAPACITY + 1)


def test_corrupt_key_slot_state_is_reported_not_trusted(fleet_name: str) -> None:
    with Fleet.join(fleet_name, CAPACITY) as fleet, Pool(fleet) as pool:
        pool.register(Key(1), 1)
        layout = Layout(POOL_KIND, CAPACITY, 256, 256)
        table_bytes = pool._table.buf  # the mapping itself
        for index in range(256):
            table_bytes[layout.key_offset(index)] = 9
        with pytest.raises(LayoutMismatch):
            pool.register(Key(2), 1)


@pytest.mark.parametrize("value", [0, 3, 100, 1 << 17, True, "8"])
def test_capacities_must_be_powers_of_two_within_bounds(value: object) -> None:
    with pytest.raises(MalformedError):
        check_capacity(value, "key_capacity")


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_geometry_comes_from_the_environment_and_bad_values_are_refused(fleet_name: str) -> None:
    code = f"""
        from orbitive import Fleet
        from orbitive.pool import Pool
        with Fleet.join({fleet_name!r}, {CAPACITY}) as fleet, Pool(fleet) as pool:
            print(pool._table.layout.key_capacity, pool._table.layout.lane_capacity)
    """
    good = _run(code, ORBIT_POOL_KEY_CAPACITY="64", ORBIT_POOL_RESOURCE_LANE_CAPACITY="1_024")
    assert good.stdout.split() == ["64", "1024"], good.stderr
    clash = _run(code)  # defaults (256, 256) against the existing (64, 1024) table
    assert "LayoutMismatch" in clash.stderr
    bad = _run(code, ORBIT_POOL_KEY_CAPACITY="100")
    assert "MalformedError" in bad.stderr and "ORBIT_POOL_KEY_CAPACITY" in bad.stderr


def test_geometry_variables_are_read_once_per_process_later_changes_ignored(
    fleet_name: str,
) -> None:
    with Processes("spawn") as processes:  # a fresh interpreter: no geometry cached yet
        child = processes.start(geometry_after_environment_change, fleet_name, CAPACITY)
        cached_before, seen, final = child.recv()
        assert child.wait() == 0
    assert cached_before is None
    assert seen == [(64, 32)] * 3  # the values at the first Pool, for every later kind too
    assert final == (64, 32)
