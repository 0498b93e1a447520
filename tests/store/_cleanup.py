"""Removing what a test fleet leaves behind (SHM objects and lock files)."""

from __future__ import annotations

from orbitive._access import lock_dir
from orbitive._region import SHM_DIR


def remove_fleet(name: str) -> None:
    """Unlink every SHM object and lock file of fleet ``name`` (this user's)."""
    for directory in (SHM_DIR, lock_dir()):
        for path in directory.glob(f"orbit-{name}-*"):
            path.unlink(missing_ok=True)
