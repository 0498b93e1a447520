"""Clocks and TTL validation shared by the lock table, the pool and the stores.

Deadlines in shared memory are integer milliseconds of ``CLOCK_MONOTONIC``: the
host-wide monotonic clock, comparable across processes on one host and never
stepped by NTP. ``time.monotonic()`` reads the same clock on Linux.
"""

from __future__ import annotations

import math
import time
from typing import Final

from ._errors import InvalidTtl

#: Longest accepted ttl, in seconds (about 31.7 years); longer is ``InvalidTtl``.
TTL_MAX_S: Final = 1e9

monotonic_ns = time.monotonic_ns


def wall_ms() -> int:
    """Unix wall clock in whole milliseconds (pool epochs and reservation ages)."""
    return time.time_ns() // 1_000_000


def check_ttl(ttl: object, *, what: str = "ttl") -> float:
    """Validate a relative duration in seconds and return it as a float.

    Args:
        ttl: seconds, an ``int`` or ``float``; ``bool`` is refused.
        what: the argument's name, used in the message.

    Returns:
        ``float(ttl)``.

    Raises:
        InvalidTtl: not a number, a bool, NaN, infinite, ``<= 0`` or above
            :data:`TTL_MAX_S`. (Seed 000: "every acquisition has a positive TTL".)
    """
    if type(ttl) is float or type(ttl) is int:  # fast path; also rejects bool
        value = float(ttl)
    elif isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise InvalidTtl(f"{what} must be a number of seconds, not {type(ttl).__name__}")
    else:
        value = float(ttl)
    if not (0.0 < value <= TTL_MAX_S):  # also false for NaN
        if math.isnan(value):
            raise InvalidTtl(f"{what} must be a finite number of seconds, got NaN")
        raise InvalidTtl(f"{what} must be > 0 and <= {TTL_MAX_S:g} seconds, got {value!r}")
    return value


def ttl_ms(ttl: float) -> int:
    """Whole milliseconds for a validated ttl; a fraction of a millisecond rounds up.

    The 1e-6 slack keeps binary noise (0.2 * 1000 == 200.00000000000003) from
    adding a millisecond.
    """
    return max(math.ceil(ttl * 1000.0 - 1e-6), 1)
