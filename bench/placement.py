"""Where the two processes of a ping-pong benchmark run.

Remote reuse is measured twice: processes placed by the scheduler (on a VM,
each round trip then pays two cross-CPU wake-ups of an idle vCPU, which costs
more than the whole pool's work), and both processes on one CPU (a wake-up is
a context switch). Children forked or spawned inside :func:`placed` inherit it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

#: Row label suffix -> one CPU?
PLACEMENTS = {"": False, ", one CPU": True}


@contextlib.contextmanager
def placed(one_cpu: bool) -> Iterator[None]:
    """Run this process, and the children it starts meanwhile, on one CPU if asked."""
    if not one_cpu or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
