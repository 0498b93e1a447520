"""A fake client that counts how many of its kind are open, for tests without a server."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any


class FakeClient:
    """A client with a serial number; ``FakeClient.open_now`` counts the unclosed ones."""

    _serials = itertools.count(1)
    _lock = threading.Lock()
    open_now = 0
    highest = 0

    def __init__(self) -> None:
        self.serial = next(self._serials)
        self.closed = False
        self.uses = 0
        with self._lock:
            FakeClient.open_now += 1
            FakeClient.highest = max(FakeClient.highest, FakeClient.open_now)

    def close(self) -> None:
        assert not self.closed, f"client {self.serial} closed twice"
        self.closed = True
        with self._lock:
            FakeClient.open_now -= 1

    @classmethod
    def reset_counts(cls) -> None:
        with cls._lock:
            cls.open_now = 0
            cls.highest = 0


def close(client: FakeClient) -> None:
    """The pool's ``close`` for fake clients."""
    client.close()


def echo(client: FakeClient, payload: bytes) -> bytes:
    """The remote-mode handler for fake clients: the payload back (a closed client raises)."""
    assert not client.closed, f"client {client.serial} used after close"
    client.uses += 1
    return payload


def retired(pool: Any, count: int, timeout: float = 10.0) -> bool:
    """Whether ``pool`` retired ``count`` clients within ``timeout`` seconds: a return that
    closes its client closes it in the pool's closing thread, after the return."""
    deadline = time.monotonic() + timeout
    while pool.counters.retired < count and time.monotonic() < deadline:
        time.sleep(0.005)
    return bool(pool.counters.retired >= count)
