"""What the network engines (PostgreSQL, Redis) share: a time bound and attempt ids.

Facts about a call over the network that these engines rely on:

* A call whose reply is lost may have committed. Retrying it blindly can change
  the answer: a grant retried finds the name held (by itself) and reports it
  busy; a release retried finds nothing and reports a lost lease. So every
  acquire carries a fresh :func:`attempt_id` stored with the grant, and every
  release or force-release leaves a receipt keyed by its attempt id; a retry
  that finds its own grant or receipt reports what the first attempt did.
* A connection can die silently (no FIN, no RST): without a bound, a read waits
  for ever. Every call therefore runs against a deadline of ``timeout`` seconds
  (the ``?timeout=S`` query parameter of the store URL, default
  :data:`TIMEOUT_DEFAULT_S`), and past it raises ``StoreError(UNAVAILABLE)``.
  The bound covers waiting for the engine's own mutex, connecting, the statement
  and its one retry (PostgreSQL: plus up to 2 s when it must reconnect, since
  libpq's connect timeout is whole seconds, at least 2).
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Iterator
from typing import Final

from .._core._errors import ErrorKind, InvalidStoreUrl, StoreError

#: Default bound on every call of a network engine, in seconds.
TIMEOUT_DEFAULT_S: Final = 5.0
#: Largest ``?timeout=`` accepted, in seconds.
TIMEOUT_MAX_S: Final = 3600.0
#: Smallest ``?timeout=`` accepted, in seconds (a round trip must fit).
TIMEOUT_MIN_S: Final = 0.05


def attempt_id() -> str:
    """A fresh random id (16 hex digits) that a retry of the same call sends again."""
    return secrets.token_hex(8)


def split_param(url: str, key: str) -> tuple[str, str | None]:
    """The URL without its ``key`` query parameter, and that parameter's raw value.

    The other parameters are kept byte for byte (libpq and redis-py read them).
    Error messages name the parameter, not the URL (which may hold a password).

    Raises:
        InvalidStoreUrl: ``key`` is given more than once.
    """
    base, mark, query = url.partition("?")
    query, hash_mark, fragment = query.partition("#")
    items = query.split("&") if mark else []
    found = [item.partition("=")[2] for item in items if item.partition("=")[0] == key]
    if len(found) > 1:
        raise InvalidStoreUrl(f"store URL parameter {key} is given {len(found)} times")
    rest = "&".join(item for item in items if item.partition("=")[0] != key)
    return base + ("?" + rest if rest else "") + hash_mark + fragment, (found[0] if found else None)


def split_timeout(url: str) -> tuple[str, float]:
    """The URL without its ``timeout`` query parameter, and that bound in seconds.

    Raises:
        InvalidStoreUrl: ``timeout`` is not a number of seconds in
            ``TIMEOUT_MIN_S..TIMEOUT_MAX_S``, or is given twice.
    """
    rest, value = split_param(url, "timeout")
    return rest, TIMEOUT_DEFAULT_S if value is None else _seconds(value)


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not TIMEOUT_MIN_S <= seconds <= TIMEOUT_MAX_S:  # also refuses NaN
        raise InvalidStoreUrl(
            f"store URL parameter timeout must be seconds in "
            f"{TIMEOUT_MIN_S:g}..{TIMEOUT_MAX_S:g}, got {value!r}"
        )
    return seconds


def unavailable(engine: str, error: BaseException | str) -> StoreError:
    """The ``StoreError(UNAVAILABLE)`` of a call that could not reach the engine."""
    return StoreError(f"{engine} store unavailable: {error}", kind=ErrorKind.UNAVAILABLE)


class Deadline:
    """The end of one call's time budget, on ``time.monotonic()``."""

    __slots__ = ("at", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.at = time.monotonic() + timeout

    def left(self) -> float:
        """Seconds left (negative once passed)."""
        return self.at - time.monotonic()

    def attempts(self) -> Iterator[int]:
        """Attempt numbers 1 and 2, the second only while time is left."""
        yield 1
        if self.left() > 0.0:
            yield 2


def timed_out(engine: str, deadline: Deadline) -> StoreError:
    """The error of a call that used up its budget."""
    return unavailable(engine, f"no reply within the {deadline.timeout:g} s call timeout")


def gave_up(engine: str, deadline: Deadline, failure: BaseException) -> StoreError:
    """The error of a call whose attempts all failed with ``failure`` (the last one)."""
    if deadline.left() <= 0.0:
        return timed_out(engine, deadline)
    return unavailable(engine, failure)
