"""Ownership and permission checks for SHM objects, their folder and other state files.

Facts this module relies on:

* ``O_NOFOLLOW`` makes ``open`` fail with ``ELOOP`` when the last path component is
  a symlink, so a planted link is refused rather than followed.
* ``fstat`` on the descriptor we opened describes exactly the object we will use;
  checking it (not the path) leaves no window for a swap between check and use.
* In a sticky directory (``/dev/shm``, mode 1777) only an entry's owner (or root)
  can rename or remove it, so our objects cannot be swapped by another user; an
  object name another user took first is refused (its owner is not us).
* Objects are created 0600 (``fchmod`` on the new descriptor, so a umask such as
  0277 cannot leave an object its peers cannot open) and never chmod'ed or chown'ed
  afterwards; an existing object with wider bits or another owner is refused,
  never "repaired".
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from ._errors import AccessDenied, FleetError

_OPEN_FLAGS = os.O_RDWR | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)


def euid() -> int:
    """The effective user id that scopes every name orbitive creates."""
    return os.geteuid()


def check_shm_dir(path: Path) -> None:
    """Refuse a shared-memory folder where another user could rename or plant our objects.

    It must be a real directory owned by root or by us; one that others may write
    must be sticky (as ``/dev/shm`` is: mode 1777), so only an entry's owner can
    rename or remove it.

    Raises:
        AccessDenied: a symlink, not a directory, another owner, or writable by
            others without the sticky bit.
        FleetError: there is no such folder (shared fleets need Linux's ``/dev/shm``).
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise FleetError(f"shared fleets need {str(path)!r} (Linux POSIX shared memory)") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise AccessDenied(f"{str(path)!r} is not a directory; refusing it")
    if info.st_uid not in (0, euid()):
        raise AccessDenied(f"{str(path)!r} is owned by uid {info.st_uid}; refusing it")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
        mode = stat.S_IMODE(info.st_mode)
        raise AccessDenied(f"{str(path)!r} has mode {mode:04o}: writable by others, not sticky")


def check_dir(path: Path) -> None:
    """Refuse a state directory (the SQLite default's) that we do not exclusively own."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise AccessDenied(f"state directory {str(path)!r} is a symlink; refusing it")
    if not stat.S_ISDIR(info.st_mode):
        raise AccessDenied(f"state directory {str(path)!r} is not a directory")
    _check_owner_mode(info, f"state directory {str(path)!r}")


def check_fd(fd: int, what: str) -> os.stat_result:
    """Refuse an opened object that is not a regular file we own with mode <= 0600.

    Raises:
        AccessDenied: with the object named by ``what``.
    """
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise AccessDenied(f"{what} is not a regular file")
    _check_owner_mode(info, what)
    return info


def _check_owner_mode(info: os.stat_result, what: str) -> None:
    if info.st_uid != euid():
        raise AccessDenied(f"{what} is owned by uid {info.st_uid}, not {euid()}")
    if info.st_mode & 0o077:
        mode = stat.S_IMODE(info.st_mode)
        raise AccessDenied(f"{what} has mode {mode:04o}; only owner access (0600/0700) is accepted")


def open_checked(path: Path | str, *, create: bool, exclusive: bool = False) -> int:
    """Open ``path`` read/write, never through a symlink, and check owner and mode.

    Args:
        path: the file.
        create: create it with mode 0600 when missing (less under a umask that
            takes owner bits, unless ``exclusive``).
        exclusive: fail with ``FileExistsError`` when it exists (``O_EXCL``); the
            new file is then made 0600 whatever the umask, so peers can open it.

    Returns:
        An ``O_CLOEXEC`` descriptor the caller owns.

    Raises:
        AccessDenied: symlink, foreign owner, wider mode, not a regular file (a
            directory too).
        FileNotFoundError: missing and ``create`` is false.
        FileExistsError: present and ``exclusive`` is true.
    """
    flags = _OPEN_FLAGS | (os.O_CREAT if create else 0) | (os.O_EXCL if exclusive else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise AccessDenied(f"{str(path)!r} is a symlink; refusing it") from None
        if error.errno == errno.EISDIR:
            raise AccessDenied(f"{str(path)!r} is a directory, not a regular file") from None
        if error.errno in (errno.EACCES, errno.EPERM):
            raise AccessDenied(f"{str(path)!r} is not ours to open ({error.strerror})") from None
        raise
    try:
        if exclusive:  # ours and new: 0600 whatever this process's umask took away
            os.fchmod(fd, 0o600)
        check_fd(fd, repr(str(path)))
    except BaseException:
        os.close(fd)
        raise
    return fd
