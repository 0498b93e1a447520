"""Fleet names unique to one test, and removal of every file such a fleet leaves."""

from __future__ import annotations

import contextlib
import secrets
import shutil
from pathlib import Path

from orbitive import Fleet
from orbitive._core._access import euid
from orbitive._core._region import SHM_DIR, object_name
from orbitive.lock import LockLayout, LockTable


def new_fleet_name() -> str:
    """A fresh fleet name no other test (or test run) uses; no '-' so globs stay exact."""
    return "t" + secrets.token_hex(6)


def shm_path(name: str, kind: int) -> Path:
    """Where the SHM object of (fleet, kind) lives on Linux."""
    return SHM_DIR / object_name(name, kind)


def fleet_files(name: str) -> list[Path]:
    """Every SHM object of fleet ``name`` (its membership object too) that exists now."""
    return list(SHM_DIR.glob(f"orbit-{name}-*"))


def users_objects() -> frozenset[str]:
    """The names of every orbitive SHM object (and client socket) of this user that exists now."""
    uid = euid()
    return frozenset(
        path.name for pattern in (f"orbit-*-{uid}", f"orbit-*-{uid}.sock")
        for path in SHM_DIR.glob(pattern)
    )  # fmt: skip


def remove_fleet_files(name: str) -> None:
    """Unlink every SHM object of fleet ``name`` (a router's folder with what it holds)."""
    for path in fleet_files(name):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            path.unlink()


def open_table(name: str, capacity: int, layout: LockLayout | None = None) -> LockTable:
    """Join fleet ``name`` (lowest free node) and open its lock table."""
    return LockTable(Fleet.join(name, capacity), layout)
