"""The store's argument guards: the name rule, the owner rule, the duration guard.

They run before any engine call, so the rules are identical on every engine
(see the rules in :mod:`._store`'s docstring). ``check_timeout`` is the core's
(the lock table's ``wait_acquire`` checks its timeout the same way).
"""

from __future__ import annotations

import os
import re
import socket
from typing import Final

from .._core import _fork
from .._core._clock import TTL_MAX_S, check_timeout, check_ttl
from .._core._errors import (
    InvalidArgumentType,
    InvalidLockName,
    InvalidLockOwner,
    InvalidLockTtl,
    InvalidSemaphoreLimit,
    InvalidTtl,
    shown,
)

__all__ = [
    "NAME_MAX_BYTES",
    "OWNER_MAX_BYTES",
    "TTL_MIN_S",
    "check_name",
    "check_owner",
    "check_renewal",
    "check_store_ttl",
    "check_timeout",
    "random_owner",
]

#: Longest lock name, in UTF-8 bytes.
NAME_MAX_BYTES: Final = 255
#: Longest owner, in UTF-8 bytes.
OWNER_MAX_BYTES: Final = 255
#: Largest semaphore limit (holders of one name at once).
LIMIT_MAX: Final = 4096
#: Shortest lease, in seconds; a shorter positive ttl counts as this on every engine.
TTL_MIN_S: Final = 0.001
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def check_name(name: object) -> str:
    """Return ``name`` if it follows the store's name rule (see :mod:`._base`).

    Raises:
        InvalidLockName: not a str, empty, longer than 255 UTF-8 bytes, a control
            character, or a lone surrogate.
    """
    # ASCII is one UTF-8 byte per character, and its only non-printable characters
    # are the rule's U+0000-U+001F and U+007F: the common case needs no encoding.
    if (
        type(name) is str
        and name.isascii()
        and 0 < len(name) <= NAME_MAX_BYTES
        and name.isprintable()
    ):
        return name
    return _check_name_fully(name)


def _check_name_fully(name: object) -> str:
    """The whole name rule, for any value the ASCII fast path did not accept."""
    if type(name) is not str:
        raise InvalidLockName(f"lock name must be a str, not {type(name).__name__}", key=name)
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        raise InvalidLockName(f"lock name {name!r} is not valid UTF-8", key=name) from None
    if not 0 < size <= NAME_MAX_BYTES:
        raise InvalidLockName(
            f"lock name must be 1..{NAME_MAX_BYTES} UTF-8 bytes, got {size}", key=name
        )
    if _CONTROL.search(name):
        raise InvalidLockName(f"lock name {name!r} contains a control character", key=name)
    return name


def check_owner(owner: object) -> str:
    """Return ``owner`` if it is a non-empty str of at most 255 UTF-8 bytes without NUL.

    Raises:
        InvalidLockOwner: any other value.
    """
    if (
        type(owner) is str
        and owner.isascii()  # one UTF-8 byte per character
        and 0 < len(owner) <= OWNER_MAX_BYTES
        and "\x00" not in owner
    ):
        return owner
    return _check_owner_fully(owner)


def _check_owner_fully(owner: object) -> str:
    """The whole owner rule, for any value the ASCII fast path did not accept."""
    if type(owner) is not str:
        raise InvalidLockOwner(f"lock owner must be a str, not {type(owner).__name__}")
    try:
        size = len(owner.encode())
    except UnicodeEncodeError:
        raise InvalidLockOwner(f"lock owner {owner!r} is not valid UTF-8") from None
    if not 0 < size <= OWNER_MAX_BYTES or "\x00" in owner:
        raise InvalidLockOwner(
            f"lock owner must be 1..{OWNER_MAX_BYTES} UTF-8 bytes without NUL, got {owner!r}"
        )
    return owner


def check_limit(limit: object, most: int = LIMIT_MAX, rule: str = "") -> int:
    """Return ``limit`` if it is an int in ``1..most`` (bools refused).

    Args:
        limit: the value to check.
        most: the largest limit the engine holds (``LIMIT_MAX``, or an engine's own).
        rule: why ``most`` is below ``LIMIT_MAX``, quoted in the error ("" for none).

    Raises:
        InvalidSemaphoreLimit: any other value (also ``ValueError`` and ``TypeError``).
    """
    if type(limit) is int and 1 <= limit <= most:
        return limit
    raise InvalidSemaphoreLimit(
        f"semaphore limit must be an int in 1..{most}{rule}, got {shown(limit)}"
    )


def check_store_ttl(ttl: object) -> float:
    """The store duration guard: a finite ttl > 0 seconds, else ``StoreError(DATABASE)``.

    Returns:
        The ttl as a float, at least :data:`TTL_MIN_S` (a shorter positive ttl is
        rounded up on every engine, as the SHM table's millisecond clock does).

    Raises:
        InvalidLockTtl: ``kind == ErrorKind.DATABASE``; ``__cause__`` is the
            validator's :class:`~orbitive._core._errors.InvalidTtl`.
    """
    if type(ttl) is float and TTL_MIN_S <= ttl <= TTL_MAX_S:  # the common case, as is
        return ttl
    try:
        value = check_ttl(ttl)
    except InvalidTtl as error:
        raise InvalidLockTtl(f"lock duration rejected: {error.message}") from error
    return value if value >= TTL_MIN_S else TTL_MIN_S


def check_renewal(auto_renew: object, on_lost: object) -> None:
    """The blocking helpers' ``auto_renew`` (a bool) and ``on_lost`` (callable or None).

    Raises:
        InvalidArgumentType: either is something else.
    """
    if type(auto_renew) is not bool:
        raise InvalidArgumentType(f"auto_renew must be a bool, not {type(auto_renew).__name__}")
    if on_lost is not None and not callable(on_lost):
        raise InvalidArgumentType(f"on_lost must be callable or None, got {shown(on_lost)}")


class _OwnerPrefix:
    """``"host:pid:"`` of this process, read once (again in a forked child)."""

    def __init__(self) -> None:
        self.text = f"{socket.gethostname()}:{os.getpid()}:"

    def _after_fork_in_child(self) -> None:
        self.text = f"{socket.gethostname()}:{os.getpid()}:"


_PREFIX: Final = _OwnerPrefix()
_fork.register(_PREFIX)


def random_owner() -> str:
    """A fresh owner naming this host and process: ``"host:pid:hex"`` (8 random hex digits,
    from ``os.urandom``: no generator state a fork would copy)."""
    return _PREFIX.text + os.urandom(4).hex()
