"""CLI fixtures: the store URLs of every engine, and a private default store.

``orbit`` commands without ``--store`` open the default store; every test here
points ``XDG_STATE_HOME`` at its own directory, so none touches the user's file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..store.conftest import (
    postgres_url,
    redis_url,
    shm_url,
    sqlite_url,
    store_url,
)

__all__ = [
    "postgres_url",
    "redis_url",
    "shm_url",
    "sqlite_url",
    "store_url",
]


@pytest.fixture(autouse=True)
def private_state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's ``XDG_STATE_HOME`` (the default store lives under it)."""
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home
