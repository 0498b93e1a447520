"""Skip marks decided by what this machine can do, probed rather than named by platform."""

from __future__ import annotations

import os

import pytest

from orbitive._region import SHM_DIR

IS_ROOT = os.geteuid() == 0
HAS_SHM_DIR = SHM_DIR.is_dir()

NEEDS_ROOT = pytest.mark.skipif(not IS_ROOT, reason="needs root to chown a file to another user")
NEEDS_SHM_DIR = pytest.mark.skipif(not HAS_SHM_DIR, reason="needs SHM objects visible in /dev/shm")
