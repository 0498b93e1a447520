"""Fork handling, in one place.

After ``os.fork()`` the child shares the parent's open file descriptions, so a
``flock`` taken through an inherited descriptor would be the parent's lock, and
a ``threading.Lock`` held by a parent thread at fork stays held forever. Every
object that keeps such state registers here; in the child each one is told to
replace it (fresh mutex, fresh lock-file descriptor, no inherited node claim,
no driver threads, which do not survive fork anyway).

``generation`` counts forks along this process's ancestry; hot paths compare a
cached copy with it to notice they run in a child, which costs one global read.

A :class:`ForkGate` covers what an at-fork hook cannot replace: the process-wide
mutexes inside a C library (SQLite's unix VFS keeps one per open database file,
shared by every connection of the process, a new one in the child included).
``os.fork()`` waits until no call through the gate is running.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class ForkAware(Protocol):
    def _after_fork_in_child(self) -> None: ...


generation = 0
_objects: weakref.WeakSet[ForkAware] = weakref.WeakSet()


def register(obj: ForkAware) -> None:
    """Call ``obj._after_fork_in_child()`` in every forked child while obj lives."""
    _objects.add(obj)


def _after_fork_in_child() -> None:
    global generation  # noqa: PLW0603 - the one process-wide fork counter
    generation += 1
    for obj in list(_objects):
        obj._after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


class ForkGate:
    """Calls that must not straddle a fork: ``os.fork()`` waits until none is running,
    and none starts until the fork returned.

    Each call holds the gate for one short step of a C library (its own waits, as
    SQLite's busy timeout, kept short: a fork waits for them). The gate counts the
    calls in progress, so threads of the process run them at once; a fork sets
    ``_forking``, which holds new calls back, and waits for the count to reach 0.
    The thread that forks must not be inside a call (it would wait for itself).
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(
            before=self._before_fork,
            after_in_parent=self._after_fork_in_parent,
            after_in_child=self._reset,
        )

    @contextmanager
    def call(self) -> Iterator[None]:
        """Hold the gate for the block: a fork in another thread waits for its end."""
        with self._condition:
            while self._forking:
                self._condition.wait()
            self._running += 1
        try:
            yield
        finally:
            with self._condition:
                self._running -= 1
                if self._running == 0:
                    self._condition.notify_all()

    def _before_fork(self) -> None:
        self._condition.acquire()  # held through the fork: no call starts or ends in it
        self._forking = True
        while self._running:
            self._condition.wait()

    def _after_fork_in_parent(self) -> None:
        self._forking = False
        self._condition.notify_all()
        self._condition.release()

    def _reset(self) -> None:
        # In the child the condition's lock is held by the thread that forked, which
        # the child is, and no call runs there: a fresh one.
        self._condition = threading.Condition(threading.Lock())
        self._running = 0
        self._forking = False
