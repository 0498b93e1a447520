"""``orbit demo`` (keyed leases, the pool): a verdict, a summary, and nothing left behind."""

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


def _figure(out: str, pattern: str) -> int:
    found = re.search(pattern, out)
    assert found is not None, f"{pattern!r} not in the summary:\n{out}"
    return int(found.group(1).replace(",", ""))


def test_pool_demo_reuses_over_sessions_and_never_exceeds_max_live(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["demo", "--scenario", "pool", "--workers", "4", "--seconds", "1.5"]) == 0
    out = capsys.readouterr().out
    max_live = _figure(out, r"max_live \(host-wide\)\s+([\d,]+)")
    assert max_live == 2  # workers // 2
    requests = _figure(out, r"requests\s+([\d,]+)")
    own = _figure(out, r"on the worker's own conn\s+([\d,]+)")
    remote = _figure(out, r"on another worker's conn\s+([\d,]+)")
    assert own > 0
    assert own + remote == requests  # every request ran on someone's warm connection
    assert _figure(out, r"connections created\s+([\d,]+)") >= 1
    assert _figure(out, r"echo round trips\s+([\d,]+)") == requests
    assert _figure(out, r"\(([\d,]+) samples\)") > 0
    assert 1 <= _figure(out, r"highest live seen\s+([\d,]+)") <= max_live
    assert _figure(out, r"server's most open conns\s+([\d,]+)") <= max_live
    assert _figure(out, r"errors\s+([\d,]+)") == 0
    assert "verdict: OK" in out
    assert fleet_files(f"pool-demo-{os.getpid()}") == []


def test_overlapping_tenures_and_backward_tokens_are_breaches() -> None:
    clean = [("k", 1, 0, 10), ("k", 2, 10, 20), ("j", 3, 5, 15)]
    assert find_overlaps(clean) == []
    overlapping = [("k", 1, 0, 10), ("k", 2, 9, 20)]
    assert len(find_overlaps(overlapping)) == 1
    backwards = [("k", 2, 0, 10), ("k", 1, 10, 20)]
    assert find_overlaps(backwards) == ["k: token 1 followed 2"]
