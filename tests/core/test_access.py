"""Modes, owners and symlinks: what orbitive creates is private, what it finds is checked."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from orbitive import Fleet
from orbitive._core._access import check_shm_dir
from orbitive._core._errors import FleetError
from orbitive._core._fleet import members_name
from orbitive._core._region import SHM_DIR
from orbitive.lock import AccessDenied, LockLayout, LockTable

from .._capabilities import NEEDS_ROOT
from .._fleets import shm_path
from .._processes import Channel, Processes

LAYOUT = LockLayout()
OTHER_UID = 4242


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def planted(path: Path, data: bytes, file_mode: int) -> tuple[bytes, int]:
    """Create ``path`` with ``data`` and ``file_mode``; return what a later check compares."""
    path.write_bytes(data)
    path.chmod(file_mode)
    return data, file_mode


def test_objects_are_0600_and_ours_and_nothing_lives_outside_dev_shm(fleet_name: str) -> None:
    with Fleet.join(fleet_name, 2) as fleet:
        table = LockTable(fleet)
        paths = sorted(SHM_DIR.glob(f"orbit-{fleet_name}-*"))
        assert paths == sorted(
            [
                shm_path(fleet_name, LAYOUT.state_kind),
                shm_path(fleet_name, LAYOUT.event_kind),
                SHM_DIR / members_name(fleet_name),
            ]
        )
        for path in paths:
            assert mode(path) == 0o600, path
            assert os.lstat(path).st_uid == os.geteuid()
        table.close()
        table.unlink()


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


def test_a_membership_object_with_a_wider_mode_is_access_denied(fleet_name: str) -> None:
    path = SHM_DIR / members_name(fleet_name)
    planted(path, b"", 0o644)
    with pytest.raises(AccessDenied):
        Fleet.join(fleet_name, 2)
    assert mode(path) == 0o644


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


def test_symlinked_membership_object_is_access_denied(tmp_path: Path, fleet_name: str) -> None:
    target = tmp_path / "target"
    planted(target, b"", 0o600)
    (SHM_DIR / members_name(fleet_name)).symlink_to(target)
    with pytest.raises(AccessDenied, match="symlink"):
        Fleet.join(fleet_name, 2)
    assert target.read_bytes() == b""


@NEEDS_ROOT
def test_object_owned_by_another_user_is_access_denied_and_untouched(fleet_name: str) -> None:
    path = shm_path(fleet_name, LAYOUT.state_kind)
    data, _ = planted(path, b"\1" * 128, 0o600)
    os.chown(path, OTHER_UID, OTHER_UID)
    with Fleet.join(fleet_name, 2) as fleet, pytest.raises(AccessDenied, match="4242"):
        LockTable(fleet)
    assert path.read_bytes() == data
    assert os.lstat(path).st_uid == OTHER_UID


def join_as(channel: Channel, uid: int, fleet_name: str) -> None:
    """In a child: become ``uid`` and join; sends the error's class name, or 'joined'."""
    os.setgid(uid)
    os.setuid(uid)
    try:
        Fleet.join(fleet_name, 2).close()
    except Exception as error:
        channel.send(type(error).__name__)
        return
    channel.send("joined")


@NEEDS_ROOT
def test_a_0600_object_of_another_user_under_our_name_is_access_denied(
    processes: Processes, fleet_name: str
) -> None:
    # The joiner runs as OTHER_UID; the object under its name belongs to OTHER_UID + 1,
    # so opening it fails with EACCES (not our uid check): still AccessDenied.
    path = SHM_DIR / f"orbit-{fleet_name}-members-{OTHER_UID}"
    planted(path, b"\0" * 128, 0o600)
    os.chown(path, OTHER_UID + 1, OTHER_UID + 1)
    try:
        assert processes.start(join_as, OTHER_UID, fleet_name).recv() == "AccessDenied"
        assert os.lstat(path).st_uid == OTHER_UID + 1
    finally:
        path.unlink()


@pytest.mark.parametrize(
    ("dir_mode", "refused"),
    [(0o1777, False), (0o700, False), (0o755, False), (0o777, True), (0o773, True)],
)
def test_a_shared_memory_folder_others_may_write_must_be_sticky(
    tmp_path: Path, dir_mode: int, refused: bool
) -> None:
    folder = tmp_path / "shm"
    folder.mkdir()
    folder.chmod(dir_mode)
    if refused:
        with pytest.raises(AccessDenied, match="sticky"):
            check_shm_dir(folder)
    else:
        check_shm_dir(folder)


def test_a_symlinked_or_missing_shared_memory_folder_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(AccessDenied, match="not a directory"):
        check_shm_dir(tmp_path / "link")
    with pytest.raises(FleetError, match="shared memory"):
        check_shm_dir(tmp_path / "missing")


@NEEDS_ROOT
def test_a_shared_memory_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "shm"
    folder.mkdir(mode=0o1777)
    os.chown(folder, OTHER_UID, OTHER_UID)
    with pytest.raises(AccessDenied, match="4242"):
        check_shm_dir(folder)


def test_the_real_shared_memory_folder_passes() -> None:
    check_shm_dir(SHM_DIR)


@pytest.mark.parametrize("which", ["membership", "state"])
def test_a_directory_under_an_object_name_is_access_denied(fleet_name: str, which: str) -> None:
    members = SHM_DIR / members_name(fleet_name)
    path = members if which == "membership" else shm_path(fleet_name, 228)
    path.mkdir(mode=0o700)
    try:
        with pytest.raises(AccessDenied, match="directory"), Fleet.join(fleet_name, 2) as fleet:
            LockTable(fleet)
        assert path.is_dir()
    finally:
        path.rmdir()


def join_with_umask(channel: Channel, uid: int, fleet_name: str, umask: int) -> None:
    """In a child: become ``uid``, set ``umask``, join and open the lock table."""
    os.setgid(uid)
    os.setuid(uid)
    os.umask(umask)
    try:
        with Fleet.join(fleet_name, 2) as fleet:
            LockTable(fleet).close()
    except Exception as error:
        channel.send(type(error).__name__)
        return
    channel.send("joined")


@NEEDS_ROOT
def test_objects_made_under_a_umask_that_takes_owner_bits_are_0600(
    processes: Processes, fleet_name: str
) -> None:
    try:
        for umask in (0o277, 0o022, 0o277):  # the creator, then peers of either umask
            child = processes.start(join_with_umask, OTHER_UID, fleet_name, umask)
            assert child.recv() == "joined"
        paths = list(SHM_DIR.glob(f"orbit-{fleet_name}-*-{OTHER_UID}"))
        assert len(paths) == 3
        assert all(mode(path) == 0o600 for path in paths)
    finally:
        for path in SHM_DIR.glob(f"orbit-{fleet_name}-*-{OTHER_UID}"):
            path.unlink()
