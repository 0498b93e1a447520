"""Skip marks decided by what this machine can do, probed rather than named by platform."""

from __future__ import annotations

import os

import pytest

from orbitive._core._region import SHM_DIR

IS_ROOT = os.geteuid() == 0
HAS_SHM_DIR = SHM_DIR.is_dir()

NEEDS_ROOT = pytest.mark.skipif(not IS_ROOT, reason="needs root to chown a file to another user")
NEEDS_SHM_DIR = pytest.mark.skipif(not HAS_SHM_DIR, reason="needs SHM objects visible in /dev/shm")


def require_c_steps(steps: object, module: str) -> None:
    """Assert a table runs its C steps: required under CI, skipped elsewhere when not built."""
    if steps is None and not os.environ.get("CI"):
        pytest.skip(f"no C compiler at install: the Python steps run (CI requires {module})")
    assert steps is not None, f"{module} was not compiled"
