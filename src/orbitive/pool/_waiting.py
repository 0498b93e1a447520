"""Waiting for a key to change: I/O-free decisions, then thin sync and asyncio drivers.

Two mechanisms, both on words in the table:

* A blocking waiter marks its node in the key's ``parked`` bytes (inside a
  critical section, so a concurrent change either sees the mark and wakes, or
  happened first and the waiter sees the new version), then sleeps on the key's
  ``changes`` word. ``key_changed`` bumps the word and wakes only if some node
  is marked.
* Asyncio tasks and a user's poll set share one readiness descriptor per
  process, the table's bell (``_core._channel``: a socket the bell's ring
  writes to). A key rings the bell only for nodes that armed ``interest`` in
  it; interest is one-shot and re-armed for every key still waited on.

:func:`decide` and :func:`sort_waiters` hold the logic; the drivers only read
words, sleep and resolve.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, final

from .._core._readiness import Readiness, wait_word
from ._layout import KEY_CHANGES
from ._table import Table
from ._values import check_seconds, check_units


@final
@dataclass(frozen=True, slots=True)
class Changed:
    """The key's version moved: return it."""

    version: int


@final
@dataclass(frozen=True, slots=True)
class Park:
    """Sleep on the word for at most ``timeout`` seconds (None: no bound)."""

    timeout: float | None


@final
@dataclass(frozen=True, slots=True)
class Expired:
    """The deadline passed with no change."""


_EXPIRED: Final = Expired()


def decide(
    current: int, since: int, deadline: float | None, now: float
) -> Changed | Park | Expired:
    """What a waiter does next, from what it read (no I/O).

    Args:
        current: the key's version word now.
        since: the version the caller saw.
        deadline: ``time.monotonic()`` seconds to give up at, or None.
        now: ``time.monotonic()`` now.
    """
    if current != since:
        return Changed(current)
    if deadline is None:
        return Park(None)
    remaining = deadline - now
    return Park(remaining) if remaining > 0 else _EXPIRED


@dataclass(slots=True)
class _Waiter:
    index: int
    since: int
    future: asyncio.Future[int | None]
    loop: asyncio.AbstractEventLoop


def sort_waiters(
    waiters: Iterable[_Waiter], versions: dict[int, int]
) -> tuple[list[tuple[_Waiter, int]], list[_Waiter]]:
    """Split waiters into (ready with their new version, still waiting), no I/O."""
    ready: list[tuple[_Waiter, int]] = []
    waiting: list[_Waiter] = []
    for waiter in waiters:
        current = versions[waiter.index]
        if current != waiter.since:
            ready.append((waiter, current))
        else:
            waiting.append(waiter)
    return ready, waiting


def check_wait(since: int, timeout: float | None) -> tuple[int, float | None]:
    """(since, seconds or None) of a wait, checked (``Pool.wait_capacity`` raises as it says)."""
    since = check_units(since, "since", 0)
    return since, None if timeout is None else check_seconds(timeout, "timeout")


def _resolve(future: asyncio.Future[int | None], value: int | None) -> None:
    if not future.done():
        future.set_result(value)


class Waiting:
    """Per-process waiting machinery of one table (sync waits, descriptor, asyncio)."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.users = 0
        self._lock = threading.Lock()
        self._readiness: Readiness | None = None
        self._waiters: list[_Waiter] = []
        self._loops: set[asyncio.AbstractEventLoop] = set()

    @classmethod
    def use(cls, table: Table) -> Waiting:
        """The table's instance in this process, one user more; :meth:`release` it.

        A forked child gets a fresh instance.
        """
        found = table.extras.get("waiting")
        if not isinstance(found, Waiting):
            found = table.extras["waiting"] = cls(table)
        found.users += 1
        return found

    def release(self) -> None:
        """One user fewer; the last one closes the descriptor (:meth:`close`)."""
        self.users -= 1
        if self.users <= 0:
            self.close()

    # -- blocking ---------------------------------------------------------------------

    def wait(self, index: int, since: int, timeout: float | None) -> int | None:
        """Block until the key's version differs from ``since`` or the timeout passes."""
        table = self.table
        deadline = None if timeout is None else time.monotonic() + timeout
        word = table.key_offset(index) + KEY_CHANGES
        while True:
            step = decide(table.park(index, since), since, deadline, time.monotonic())
            if isinstance(step, Changed):
                return step.version
            try:
                if isinstance(step, Park):
                    wait_word(table.buf, word, since, step.timeout)
            finally:
                current = table.unpark(index)
            if current != since:  # woken by the change: decide's first rule, on the hot path
                return current
            step = decide(current, since, deadline, time.monotonic())
            if isinstance(step, Changed):
                return step.version
            if isinstance(step, Expired):
                return None

    # -- descriptor -------------------------------------------------------------------

    def readiness(self) -> Readiness:
        """The process's readiness descriptor, started on first use."""
        with self._lock:
            if self._readiness is None:
                table = self.table
                self._readiness = Readiness(
                    table.channel, table.node, f"orbit-pool-{table.region.name}-{table.node}"
                )
            return self._readiness

    def fileno(self) -> int:
        """The descriptor's number."""
        return self.readiness().fileno()

    def watch(self, index: int) -> int:
        """Open the descriptor, then arm interest in one key; its version."""
        self.readiness()
        return self.table.arm([index])[0]

    def clear(self) -> int:
        """Drain the descriptor."""
        return self.readiness().drain()

    # -- asyncio ----------------------------------------------------------------------

    async def poll(self, index: int, since: int, timeout: float | None) -> int | None:
        """Await a change of the key's version (None after ``timeout`` seconds)."""
        loop = asyncio.get_running_loop()
        readiness = self.readiness()  # armed before interest is
        current = self.table.arm([index])[0]
        if current != since:
            return current
        waiter = _Waiter(index, since, loop.create_future(), loop)
        with self._lock:
            self._waiters.append(waiter)
            if loop not in self._loops:
                loop.add_reader(readiness.fileno(), self._on_ready, loop)
                self._loops.add(loop)
        timer = None if timeout is None else loop.call_later(timeout, _resolve, waiter.future, None)
        try:
            return await waiter.future
        finally:
            if timer is not None:
                timer.cancel()
            self._forget(waiter)

    def _forget(self, waiter: _Waiter) -> None:
        with self._lock:
            self._waiters.remove(waiter)
            loop = waiter.loop
            if loop in self._loops and not any(w.loop is loop for w in self._waiters):
                self._loops.discard(loop)
                if not loop.is_closed() and self._readiness is not None:
                    loop.remove_reader(self._readiness.fileno())

    def _on_ready(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._readiness is None:
            return
        self._readiness.drain()
        with self._lock:
            pending = [w for w in self._waiters if not w.future.done()]
        indexes = sorted({w.index for w in pending})
        if not indexes:
            return
        # Re-arm first, then read: a change after the read rings the bell again.
        versions = dict(zip(indexes, self.table.arm(indexes), strict=True))
        ready, _ = sort_waiters(pending, versions)
        for waiter, version in ready:
            if waiter.loop is loop:
                _resolve(waiter.future, version)
            else:
                waiter.loop.call_soon_threadsafe(_resolve, waiter.future, version)

    def close(self) -> None:
        """Close the descriptor."""
        with self._lock:
            readiness, self._readiness = self._readiness, None
            loops, self._loops = self._loops, set()
        for loop in loops:
            if not loop.is_closed() and readiness is not None:
                loop.remove_reader(readiness.fileno())
        if readiness is not None:
            readiness.close()
