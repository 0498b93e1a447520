"""Worker processes for the asyncio store tests, run by ``tests._processes``."""

from __future__ import annotations

import time

from orbitive.store import open_store

from .._processes import Channel


def hold(channel: Channel, url: str, name: str, ttl: float, hold_s: float) -> None:
    """Take ``name`` for ``ttl`` s, say ``"held"``, keep it ``hold_s`` s, release it."""
    with open_store(url) as store:
        lock = store.try_lock(name, "other-process", ttl)
        if lock is None:
            raise AssertionError(f"{name!r} was not free")
        channel.send("held")
        time.sleep(hold_s)
        channel.send("released" if lock.release() else "lapsed")
