"""Ownership and permission checks for lock files, the lock directory and SHM objects.

Facts this module relies on:

* ``O_NOFOLLOW`` makes ``open`` fail with ``ELOOP`` when the last path component is
  a symlink, so a planted link is refused rather than followed.
* ``fstat`` on the descriptor we opened describes exactly the object we will use;
  checking it (not the path) leaves no window for a swap between check and use.
* A directory checked with ``lstat`` that is a real directory owned by us with no
  group/other bits cannot have entries planted in it by another (non-root) user.
* Objects are created 0600 and never chmod'ed or chown'ed afterwards; an existing
  object with wider bits or another owner is refused, never "repaired".
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from ._errors import AccessDenied

_OPEN_FLAGS = os.O_RDWR | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)


def euid() -> int:
    """The effective user id that scopes every name orbitive creates."""
    return os.geteuid()


def lock_dir() -> Path:
    """Return the per-user lock directory, creating it 0700 when missing.

    ``$XDG_RUNTIME_DIR/orbit-{uid}`` when that variable is an absolute path, else
    ``/tmp/orbit-{uid}``.

    Raises:
        AccessDenied: the path is a symlink, not a directory, owned by another
            user, or grants any group/other permission bit.
    """
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    root = Path(base) if base.startswith("/") else Path("/tmp")
    path = root / f"orbit-{euid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    check_dir(path)
    return path


def check_dir(path: Path) -> None:
    """Refuse a lock directory we do not exclusively own (see :func:`lock_dir`)."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise AccessDenied(f"lock directory {str(path)!r} is a symlink; refusing it")
    if not stat.S_ISDIR(info.st_mode):
        raise AccessDenied(f"lock directory {str(path)!r} is not a directory")
    _check_owner_mode(info, f"lock directory {str(path)!r}")


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
        create: create it with mode 0600 when missing.
        exclusive: fail with ``FileExistsError`` when it exists (``O_EXCL``).

    Returns:
        An ``O_CLOEXEC`` descriptor the caller owns.

    Raises:
        AccessDenied: symlink, foreign owner, wider mode, not a regular file.
        FileNotFoundError: missing and ``create`` is false.
        FileExistsError: present and ``exclusive`` is true.
    """
    flags = _OPEN_FLAGS | (os.O_CREAT if create else 0) | (os.O_EXCL if exclusive else 0)
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise AccessDenied(f"{str(path)!r} is a symlink; refusing it") from None
        raise
    try:
        check_fd(fd, repr(str(path)))
    except BaseException:
        os.close(fd)
        raise
    return fd
