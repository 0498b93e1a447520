"""``orbit demo`` (the keyed-lease scenario): a verdict, a summary, and nothing left behind."""

from __future__ import annotations

import os
import re

import pytest

from orbitive.cli import main
from orbitive.cli._demo import find_overlaps

from .._fleets import fleet_files


def test_lock_demo_reports_a_clean_verdict_and_leaves_no_files(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--scenario", "lock", "--workers", "3", "--seconds", "1"]) == 0
    out = capsys.readouterr().out
    assert "verdict: OK" in out
    acquisitions = int(re.search(r"acquisitions\s+([\d,]+)", out).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert acquisitions > 0
    assert fleet_files(f"demo-{os.getpid()}") == []


def test_overlapping_tenures_and_backward_tokens_are_breaches() -> None:
    clean = [("k", 1, 0, 10), ("k", 2, 10, 20), ("j", 3, 5, 15)]
    assert find_overlaps(clean) == []
    overlapping = [("k", 1, 0, 10), ("k", 2, 9, 20)]
    assert len(find_overlaps(overlapping)) == 1
    backwards = [("k", 2, 0, 10), ("k", 1, 10, 20)]
    assert find_overlaps(backwards) == ["k: token 1 followed 2"]
