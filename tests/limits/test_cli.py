"""``orbit list`` names the rate-limit table by what it holds; ``orbit clear`` leaves it
while a process using it lives."""

from __future__ import annotations

import pytest
from limits.storage import storage_from_string

from orbitive.cli import main
from orbitive.cli._lock_commands import KNOWN_KINDS
from orbitive.limits import _shm_storage
from orbitive.limits._layout import RATE_KIND

from .._fleets import shm_path


def test_the_cli_knows_the_kind_the_table_uses() -> None:
    assert KNOWN_KINDS[RATE_KIND] == "rate-limit table"


def test_list_shows_the_rate_limit_table_and_clear_refuses_while_it_is_used(
    fleet: str, capsys: pytest.CaptureFixture[str]
) -> None:
    storage_from_string(f"shm://{fleet}").incr("k", 60)
    assert main(["list", fleet]) == 0
    out = capsys.readouterr().out
    assert f"orbit-{fleet}-{RATE_KIND}-" in out and "rate-limit table" in out
    assert main(["clear", fleet, "--kind", str(RATE_KIND)]) != 0
    assert shm_path(fleet, RATE_KIND).exists()
    _shm_storage.close_tables()  # the process leaves the fleet
    assert main(["clear", fleet, "--kind", str(RATE_KIND)]) == 0
    assert not shm_path(fleet, RATE_KIND).exists()
