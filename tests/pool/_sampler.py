"""A thread of the test process that reads the pool table until stopped."""

from __future__ import annotations

import threading
import time

from orbitive.pool import Candidate, Key, Pool


def settled(pool: Pool, key: Key, seconds: float = 10.0) -> list[Candidate]:
    """``key``'s candidates once every unit came back, or as they are after ``seconds``.

    An owner completes each unit just after its reply went out, so the last
    completions may still be on their way when the borrowers report.
    """
    deadline = time.monotonic() + seconds
    while True:
        candidates = pool.candidates(key)
        if all(c.reserved == c.active == 0 for c in candidates) or time.monotonic() > deadline:
            return candidates
        time.sleep(0.01)


class Sampler:
    """Calls :meth:`sample` every ``interval`` seconds in a thread; subclasses record."""

    def __init__(self, pool: Pool, interval: float) -> None:
        self.pool = pool
        self.samples = 0
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> None:
        """Read the table once (one sample)."""
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()
            self.samples += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10.0)
