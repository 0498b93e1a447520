"""``orbit pool FLEET`` prints the table from an attach-only, read-only view."""

from __future__ import annotations

import pytest

from orbitive import Fleet
from orbitive.cli import main
from orbitive.pool import Key, Pool

from .conftest import CAPACITY


def test_orbit_pool_shows_keys_resources_owners_and_claims(
    fleet_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Fleet.join(fleet_name, CAPACITY) as fleet, Pool(fleet) as pool:
        key = Key(0xABCDEF)
        rid = pool.register(key, 3)
        lease = pool.reserve(rid)
        execution = pool.accept(pool.reserve(rid))
        permit = pool.claim_create(key, 5)
        incarnation = fleet.incarnation
        assert main(["pool", fleet_name]) == 0
        out = capsys.readouterr().out
        execution.complete()
        permit.finish()
        pool.cancel_reservation(lease)
    assert f"pool of fleet {fleet_name!r}, kind 247" in out
    assert "1 live, 0 draining, 1 reserved, 1 active, 1 creating" in out
    assert f"node 0 (incarnation {incarnation}, alive)" in out
    assert f"{key}" in out and "node 0: 1" in out
    row = next(line for line in out.splitlines() if line.strip().startswith(str(rid)))
    assert row.split()[2:] == ["0", "alive", str(incarnation), "live", "3", "1", "1", "2"]
    after = _output(capsys, fleet_name)  # the owner's process life is over: it shows dead
    assert "(incarnation" in after and "dead)" in after


def test_orbit_pool_without_a_table_says_so(
    fleet_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pool", fleet_name]) == 1
    assert "orbit pool: fleet " in (err := capsys.readouterr().err)
    assert "has no resource pool table (kind 247)" in err


def _output(capsys: pytest.CaptureFixture[str], fleet_name: str) -> str:
    """What ``orbit pool`` prints now; the pool object may outlive its last member."""
    main(["pool", fleet_name])
    return capsys.readouterr().out
