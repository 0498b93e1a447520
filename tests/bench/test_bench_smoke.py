"""The benchmark runner cannot rot: its quick mode runs end to end, and its ratios are right.

The quick run is a subprocess (``python -m bench --quick``) so it forks and starts
servers exactly as a user's run does; rows whose package or server is missing
must come back skipped with a reason, never as an error.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench._measure import Result
from bench._report import markdown, ratios

ROOT = Path(__file__).resolve().parents[2]
CONTENTION_GROUPS = {
    "1 process, 1 key",
    "2 processes, 1 key",
    "4 processes, 1 key",
    "8 processes, 1 key",
    "1 process, 64 keys",
    "8 processes, 64 keys",
}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("bench")
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "results.json").read_text()), out


def _rows(document: dict[str, Any], section: str, name: str) -> list[dict[str, Any]]:
    return [r for r in document["results"] if r["section"] == section and r["name"] == name]


@pytest.mark.slow
def test_quick_mode_measures_lock_table_and_floor(quick_run: tuple[dict[str, Any], Path]) -> None:
    document, _ = quick_run
    assert document["mode"] == "quick"
    for name in ("orbitive LockTable", "fcntl.flock pair"):
        (row,) = _rows(document, "acquire + release", name)
        assert row["skipped"] is None
        assert len(row["samples"]) >= 3
        assert all(0 < sample < 10_000 for sample in row["samples"])
    (floor,) = _rows(document, "acquire + release", "fcntl.flock pair")
    assert floor["x_floor"] == pytest.approx(1.0)


@pytest.mark.slow
def test_quick_mode_contention_has_every_group(quick_run: tuple[dict[str, Any], Path]) -> None:
    document, _ = quick_run
    rows = _rows(document, "contention", "orbitive LockTable.wait_acquire")
    assert {row["group"] for row in rows} == CONTENTION_GROUPS
    for row in rows:
        assert row["median"] > 0
        assert 0.0 <= row["extra"]["min_max_share"] <= 1.0
        assert 0.0 <= row["extra"]["min_fair_share"] <= 1.0
        assert row["x_floor"] is not None


@pytest.mark.slow
def test_quick_mode_skips_with_a_reason(quick_run: tuple[dict[str, Any], Path]) -> None:
    document, out = quick_run
    for row in document["results"]:
        assert row["skipped"] is None or row["skipped"].strip(), row
        assert bool(row["samples"]) != bool(row["skipped"]), row
    wake = [row for row in document["results"] if row["section"] == "wake latency"]
    assert any(row["kind"] == "floor" and row["samples"] for row in wake)
    assert "| orbitive LockTable |" in (out / "results.md").read_text()
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "contention.png").read_bytes().startswith(b"\x89PNG")


def test_ratios_are_costs_against_floor_and_best_alternative() -> None:
    results = [
        Result("s", "g", "floor", "floor", "us", [1.0, 1.0, 1.0]),
        Result("s", "g", "slow alt", "alternative", "us", [8.0]),
        Result("s", "g", "fast alt", "alternative", "us", [2.0, 3.0, 2.0]),
        Result("s", "g", "ours", "orbitive", "us", [4.0]),
        Result("t", "g", "floor", "floor", "ops/s", [1000.0]),
        Result("t", "g", "ours", "orbitive", "ops/s", [250.0]),
        Result("s", "g", "gone", "alternative", "us", skipped="not installed"),
    ]
    found = ratios(results)
    assert found[0] == (1.0, 0.5)
    assert found[3] == (4.0, 2.0)
    assert found[5] == (4.0, None)
    assert 6 not in found
    assert "| g | gone | skipped |" in markdown(results)
