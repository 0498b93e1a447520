"""Children of the rate-limit process tests: each opens the storage by URL itself.

Targets run as ``target(channel, *args)`` (``tests._processes``); they import no test
framework.
"""

from __future__ import annotations

import os
import signal

import limits
from limits import strategies
from limits.storage import storage_from_string

import orbitive.limits  # noqa: F401 - registers shm://
from orbitive.limits import _table

from .._processes import Channel

STRATEGIES: dict[str, type[strategies.RateLimiter]] = {
    "fixed": strategies.FixedWindowRateLimiter,
    "moving": strategies.MovingWindowRateLimiter,
    "sliding": strategies.SlidingWindowCounterRateLimiter,
}


def _limiter(url: str, strategy: str) -> strategies.RateLimiter:
    return STRATEGIES[strategy](storage_from_string(url))


def hammer(channel: Channel, url: str, strategy: str, item: str, tries: int) -> None:
    """Say "ready", wait for "go", hit the key ``tries`` times; send how many were admitted."""
    limiter, parsed = _limiter(url, strategy), limits.parse(item)
    channel.send("ready")
    channel.recv()
    channel.send(sum(limiter.hit(parsed, "shared") for _ in range(tries)))


def hammer_until_killed(channel: Channel, url: str, strategy: str, item: str) -> None:
    """Say "ready", then hit the key for ever, sending 1 after each admitted hit."""
    limiter, parsed = _limiter(url, strategy), limits.parse(item)
    channel.send("ready")
    while True:
        if limiter.hit(parsed, "shared"):
            channel.send(1)


def die_inside(channel: Channel, url: str, strategy: str, item: str, point: str) -> None:
    """Hit the key once, SIGKILLed at ``point`` inside the table step (``_table.crash_hook``)."""
    limiter, parsed = _limiter(url, strategy), limits.parse(item)

    def hook(reached: str) -> None:
        if reached == point:
            os.kill(os.getpid(), signal.SIGKILL)

    _table.crash_hook = hook
    limiter.hit(parsed, "shared")
    channel.send("survived")
