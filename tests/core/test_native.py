"""What says whether the C modules loaded: ``orbitive.native()``, ``orbit --version``, and
the one RuntimeWarning of a table opened without its C steps."""

from __future__ import annotations

import json
import os
from pathlib import Path

import orbitive
from orbitive._core import _native

from .._processes import run_interpreter
from ._without_c import report


def test_native_is_true_only_when_every_c_module_loads() -> None:
    loaded = _native.loaded()
    assert list(loaded) == list(_native.MODULES)
    assert orbitive.native() is all(loaded.values())
    if os.environ.get("CI"):  # CI builds them all
        assert orbitive.native() is True


def test_without_the_c_modules_each_table_kind_warns_once_and_runs_in_python(
    fleet_name: str,
) -> None:
    blocked = (*_native.MODULES, *_native.EXTRA_MODULES)
    seen = json.loads(run_interpreter(report, fleet_name, *blocked))
    assert seen["native"] is False
    assert seen["released"] is True  # the Python steps give the same results
    kinds = [category for category, _, _ in seen["warnings"]]
    assert kinds == ["RuntimeWarning", "RuntimeWarning"]  # one per table kind, not per table
    lock, pool = (message for _, message, _ in seen["warnings"])
    assert "orbitive.lock._fastpath is not built" in lock
    assert "orbitive.pool._fastpath is not built" in pool
    for message in (lock, pool):
        assert "times as many instructions" in message
        assert "C compiler" in message
        assert "pip install --force-reinstall --no-cache-dir orbitive" in message
    # Attributed to the code that opened the table, not to orbitive's insides.
    assert {Path(filename).name for _, _, filename in seen["warnings"]} == {"_without_c.py"}
    lines = seen["version"].splitlines()
    assert lines[0].startswith(f"orbit (orbitive) {orbitive.__version__}")
    assert lines[1:] == [
        f"{name:<{max(map(len, blocked))}}  not built (Python steps run)" for name in blocked
    ]
