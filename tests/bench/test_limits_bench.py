"""bench/limits_bench.py cannot rot: its quick mode runs end to end, every storage it
can reach has figures, with ratios against memory://, and the others say why not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = {"limits fixed-window hit (100/minute)", "limits moving-window hit (100/minute)"}
STORAGES = ("memory://", "shm://", "redis://", "postgresql://")


@pytest.mark.slow
def test_quick_mode_times_each_storage_against_memory(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "bench/limits_bench.py", "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    document: dict[str, Any] = json.loads((tmp_path / "results.json").read_text())
    assert document["mode"] == "quick"
    rows = {(r["section"], r["group"], r["name"]): r for r in document["results"]}
    assert {(section, group) for section, group, _ in rows} == {
        (section, group) for section in SECTIONS for group in ("1 key", "1,000 keys")
    }
    for (section, group, name), row in rows.items():
        assert name in STORAGES
        assert bool(row["samples"]) != bool(row["skipped"]), row
        if name == "memory://":
            assert row["x_floor"] == pytest.approx(1.0)
        if row["samples"]:
            assert all(0 < sample < 100_000 for sample in row["samples"]), row
            assert row["x_floor"] > 0
            # One key is hit far past its limit; 1,000 keys each stay within theirs.
            assert row["extra"]["admitted_share"] == (1.0 if group == "1,000 keys" else 0.0)
        if name == "shm://":
            assert row["samples"], (section, group, row["skipped"])
        if name == "postgresql://":
            assert row["skipped"] == "no --postgres URL given"
    assert "| 1,000 keys | shm:// |" in (tmp_path / "results.md").read_text()
