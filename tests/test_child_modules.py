"""The modules that spawned children import load no test framework: importing pytest
costs a spawned child about 0.2 s of CPU, and the suite spawns children by the
hundred (every test on the ``processes`` fixture runs once with spawn)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The modules whose functions children run (each says so in its docstring).
CHILD_MODULES = [
    "tests._children",
    "tests._processes",
    "tests.clients._budget_host",
    "tests.clients._injection",
    "tests.clients._psycopg_workers",
    "tests.clients._workers",
    "tests.limits._pg_children",
    "tests.pool._geometry",
    "tests.store._workers",
]
PROBE = """
import importlib, sys
importlib.import_module(sys.argv[1])
print(" ".join(sorted(m for m in sys.modules if m.split(".")[0] in ("pytest", "_pytest"))))
"""


@pytest.mark.parametrize("module", CHILD_MODULES)
def test_a_child_module_imports_no_test_framework(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == "", f"{module} imports {done.stdout.split()[:3]}"
