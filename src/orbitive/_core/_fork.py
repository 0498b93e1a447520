"""Fork handling, in one place.

After ``os.fork()`` the child shares the parent's open file descriptions, so a
``flock`` taken through an inherited descriptor would be the parent's lock, and
a ``threading.Lock`` held by a parent thread at fork stays held forever. Every
object that keeps such state registers here; in the child each one is told to
replace it (fresh mutex, fresh lock-file descriptor, no inherited node claim,
no driver threads, which do not survive fork anyway).

``generation`` counts forks along this process's ancestry; hot paths compare a
cached copy with it to notice they run in a child, which costs one global read.
"""

from __future__ import annotations

import os
import weakref
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
