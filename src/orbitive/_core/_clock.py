"""Clocks and TTL validation shared by the lock table, the pool and the stores.

Deadlines in shared memory are integer milliseconds of ``CLOCK_MONOTONIC``: the
host-wide monotonic clock, comparable across processes on one host and never
stepped by NTP. ``time.monotonic()`` reads the same clock on Linux.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Final, cast

from ._errors import InvalidTtl, shown

#: Longest accepted ttl, in seconds (about 31.7 years); longer is ``InvalidTtl``.
TTL_MAX_S: Final = 1e9

#: Ints up to this size convert to float without OverflowError.
_FLOAT_INT_MAX: Final = int(sys.float_info.max)

monotonic_ns = time.monotonic_ns


def wall_ms() -> int:
    """Unix wall clock in whole milliseconds (pool epochs and reservation ages)."""
    return time.time_ns() // 1_000_000


def check_ttl(ttl: object, *, what: str = "ttl") -> float:
    """Validate a relative duration in seconds and return it as a float.

    Int and float subclasses count by the number they store: their own
    ``__float__``, ``__index__`` or comparison hooks are never called.

    Args:
        ttl: seconds, an ``int`` or ``float``; ``bool`` is refused.
        what: the argument's name, used in the message.

    Returns:
        The number as a ``float``.

    Raises:
        InvalidTtl: not a number, a bool, NaN, infinite, ``<= 0`` or above
            :data:`TTL_MAX_S` (however large an int). (Lease contract: "every
            acquisition has a positive TTL".)
    """
    if type(ttl) is float:  # the common case
        value = ttl
    elif type(ttl) is int and 0 < ttl <= TTL_MAX_S:  # exact: int and float compare by value
        return float(ttl)
    else:
        value = as_seconds(ttl, what)
    if not (0.0 < value <= TTL_MAX_S):  # also false for NaN
        if math.isnan(value):
            raise InvalidTtl(f"{what} must be a finite number of seconds, got NaN")
        raise InvalidTtl(f"{what} must be > 0 and <= {TTL_MAX_S:g} seconds, got {shown(ttl)}")
    return value


def check_timeout(timeout: object) -> float | None:
    """``None`` (wait forever) or a finite number of seconds ``>= 0``, as a float.

    Raises:
        InvalidTtl: anything else (also ``ValueError`` and ``TypeError``).
    """
    if timeout is None:
        return None
    if type(timeout) is float and 0.0 < timeout <= TTL_MAX_S:  # the common case, as is
        return timeout
    try:
        seconds = as_seconds(timeout, "timeout")
        return 0.0 if seconds == 0.0 else check_ttl(seconds, what="timeout")
    except InvalidTtl as error:
        raise InvalidTtl(
            f"timeout must be None (wait forever) or a finite number of seconds >= 0, "
            f"got {shown(timeout)}"
        ) from error


def as_seconds(ttl: object, what: str) -> float:
    """The float an int or a float (or a subclass of either) stores, unchecked.

    An int past the float range reads as an infinity of its sign; the value's own
    hooks are never called.

    Raises:
        InvalidTtl: a bool or any other type.
    """
    kind = type(ttl)  # type(), not isinstance: a __class__ property may lie
    if issubclass(kind, float):
        return float.__float__(cast(float, ttl))
    if issubclass(kind, int) and not issubclass(kind, bool):
        number = int.__index__(cast(int, ttl))
        if abs(number) <= _FLOAT_INT_MAX:
            return float(number)
        return math.inf if number > 0 else -math.inf
    raise InvalidTtl(f"{what} must be a number of seconds, not {kind.__name__}")


def ttl_ms(ttl: float) -> int:
    """Whole milliseconds for a validated ttl; a fraction of a millisecond rounds up.

    The 1e-6 slack keeps binary noise (0.2 * 1000 == 200.00000000000003) from
    adding a millisecond.
    """
    return max(math.ceil(ttl * 1000.0 - 1e-6), 1)
