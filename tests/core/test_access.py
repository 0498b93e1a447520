"""Modes, owners and symlinks: what orbitive creates is private, what it finds is checked."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orbitive import Fleet
from orbitive._access import lock_dir
from orbitive._fleet import membership_path, node_path
from orbitive._region import lock_path
from orbitive.lock import AccessDenied, LockLayout, LockTable

from .._capabilities import NEEDS_ROOT, NEEDS_SHM_DIR
from .._fleets import shm_path

LAYOUT = LockLayout()


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def runtime_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private XDG_RUNTIME_DIR for this test, so the lock directory is made fresh."""
    base = tmp_path / "runtime"
    base.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
    return base


def planted(path: Path, data: bytes, file_mode: int) -> tuple[bytes, int]:
    """Create ``path`` with ``data`` and ``file_mode``; return what a later check compares."""
    path.write_bytes(data)
    path.chmod(file_mode)
    return data, file_mode


@NEEDS_SHM_DIR
def test_objects_and_lock_files_are_0600_in_a_0700_lock_directory(
    runtime_dir: Path, fleet_name: str
) -> None:
    with Fleet.join(fleet_name, 2) as fleet:
        table = LockTable(fleet)
        directory = lock_dir()
        assert directory == runtime_dir / f"orbit-{os.geteuid()}"
        assert mode(directory) == 0o700
        for path in (
            shm_path(fleet_name, LAYOUT.state_kind),
            shm_path(fleet_name, LAYOUT.event_kind),
            lock_path(fleet_name, LAYOUT.state_kind),
            lock_path(fleet_name, LAYOUT.event_kind),
            node_path(fleet_name, fleet.node),
            membership_path(fleet_name),
        ):
            assert mode(path) == 0o600, path
            assert os.lstat(path).st_uid == os.geteuid()
        table.close()
        table.unlink()


def test_lock_directory_defaults_to_tmp_without_an_absolute_runtime_dir(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for value in ("", "relative/dir"):
        monkeypatch.setenv("XDG_RUNTIME_DIR", value)
        assert lock_dir() == Path("/tmp") / f"orbit-{os.geteuid()}"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert lock_dir().parent == Path("/tmp")


@NEEDS_SHM_DIR
@pytest.mark.parametrize("file_mode", [0o644, 0o640, 0o606, 0o610])
def test_preexisting_object_with_a_wider_mode_is_access_denied_and_untouched(
    fleet_name: str, file_mode: int
) -> None:
    path = shm_path(fleet_name, LAYOUT.state_kind)
    data, _ = planted(path, b"not ours to judge" * 10, file_mode)
    with Fleet.join(fleet_name, 2) as fleet, pytest.raises(AccessDenied) as caught:
        LockTable(fleet)
    assert isinstance(caught.value, PermissionError)
    assert f"{file_mode:04o}" in str(caught.value)
    assert (path.read_bytes(), mode(path)) == (data, file_mode)


@pytest.mark.parametrize("file_mode", [0o644, 0o620])
def test_preexisting_lock_file_with_a_wider_mode_is_access_denied_and_untouched(
    runtime_dir: Path, fleet_name: str, file_mode: int
) -> None:
    del runtime_dir
    path = lock_path(fleet_name, LAYOUT.state_kind)
    data, _ = planted(path, b"", file_mode)
    with Fleet.join(fleet_name, 2) as fleet, pytest.raises(AccessDenied):
        LockTable(fleet)
    assert (path.read_bytes(), mode(path)) == (data, file_mode)
    node_file = node_path(fleet_name, 0)
    planted(node_file, b"", 0o644)
    with pytest.raises(AccessDenied):
        Fleet.join(fleet_name, 2, node=0)
    assert mode(node_file) == 0o644


def test_symlinked_lock_directory_is_access_denied_and_untouched(
    runtime_dir: Path, fleet_name: str
) -> None:
    real = runtime_dir / "elsewhere"
    real.mkdir(mode=0o700)
    link = runtime_dir / f"orbit-{os.geteuid()}"
    link.symlink_to(real)
    with pytest.raises(AccessDenied, match="symlink"):
        Fleet.join(fleet_name, 2)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert list(real.iterdir()) == []
    assert mode(real) == 0o700


@pytest.mark.parametrize("dir_mode", [0o755, 0o711, 0o770])
def test_lock_directory_with_a_wider_mode_is_access_denied_and_untouched(
    runtime_dir: Path, fleet_name: str, dir_mode: int
) -> None:
    directory = runtime_dir / f"orbit-{os.geteuid()}"
    directory.mkdir()
    directory.chmod(dir_mode)
    with pytest.raises(AccessDenied):
        Fleet.join(fleet_name, 2)
    assert mode(directory) == dir_mode
    assert list(directory.iterdir()) == []


def test_lock_directory_that_is_a_file_is_access_denied(runtime_dir: Path, fleet_name: str) -> None:
    planted(runtime_dir / f"orbit-{os.geteuid()}", b"", 0o600)
    with pytest.raises(AccessDenied, match="not a directory"):
        Fleet.join(fleet_name, 2)


@NEEDS_SHM_DIR
def test_symlinked_object_is_access_denied_and_its_target_untouched(
    tmp_path: Path, fleet_name: str
) -> None:
    target = tmp_path / "target"
    data, _ = planted(target, b"\0" * 4096, 0o600)
    link = shm_path(fleet_name, LAYOUT.state_kind)
    link.symlink_to(target)
    with Fleet.join(fleet_name, 2) as fleet, pytest.raises(AccessDenied, match="symlink"):
        LockTable(fleet)
    assert target.read_bytes() == data
    assert link.is_symlink()


def test_symlinked_lock_file_is_access_denied(
    runtime_dir: Path, tmp_path: Path, fleet_name: str
) -> None:
    del runtime_dir
    target = tmp_path / "target"
    planted(target, b"", 0o600)
    membership_path(fleet_name).symlink_to(target)
    with pytest.raises(AccessDenied, match="symlink"):
        Fleet.join(fleet_name, 2)


@NEEDS_ROOT
@NEEDS_SHM_DIR
def test_object_owned_by_another_user_is_access_denied_and_untouched(fleet_name: str) -> None:
    path = shm_path(fleet_name, LAYOUT.state_kind)
    data, _ = planted(path, b"\1" * 128, 0o600)
    os.chown(path, 4242, 4242)
    with Fleet.join(fleet_name, 2) as fleet, pytest.raises(AccessDenied, match="4242"):
        LockTable(fleet)
    assert path.read_bytes() == data
    assert os.lstat(path).st_uid == 4242


@NEEDS_ROOT
def test_lock_directory_owned_by_another_user_is_access_denied(
    runtime_dir: Path, fleet_name: str
) -> None:
    directory = runtime_dir / f"orbit-{os.geteuid()}"
    directory.mkdir(mode=0o700)
    os.chown(directory, 4242, 4242)
    with pytest.raises(AccessDenied, match="4242"):
        Fleet.join(fleet_name, 2)
    assert list(directory.iterdir()) == []
