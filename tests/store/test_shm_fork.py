"""An ``shm://`` store closed before a fork, and the stores of the forked children.

A closed store's lock table waits in a reference cycle for the garbage collector, and
a forked child inherits it, with its mappings of the fleet's objects: the collector
may free it in the child at any allocation, inside a step of the child's own store on
the same objects. Here the inherited store is kept in a list, and freed inside one
such step on purpose (the soak of ``test_semaphore_processes`` met it by chance: a
churner's semaphore acquisition raised StoreError, its section's unlock EPERM).
"""

from __future__ import annotations

import gc

from orbitive.lock import LockKey, LockLease
from orbitive.store import open_store
from orbitive.store._shm import ShmEngine

from .._processes import Channel, Processes
from ._workers import PATIENCE_S

#: What the test process opened and closed before it forked (each child inherits it).
INHERITED: list[object] = []


def fill_as_the_inherited_store_goes(channel: Channel, url: str) -> None:
    """Fill a semaphore of limit 1, then ask again: with every slot held, the acquisition
    reads the marker in a Python step (the whole section), and the inherited store goes
    inside that step. Reports what each call returned."""
    with open_store(url) as store:
        engine = store._backend.engine
        assert isinstance(engine, ShmEngine)
        reference = engine._table._reference
        step = reference.current

        def current_as_the_inherited_store_goes(
            key: LockKey, _: None, __: int, now: int
        ) -> LockLease | None:
            INHERITED.clear()  # the last reference in this process: freed here
            gc.collect()
            return step(key, _, __, now)

        sem = store.semaphore("full", 1)
        lease = sem.try_acquire("first", 60.0)
        vars(reference)["current"] = current_as_the_inherited_store_goes  # this step only
        try:
            busy = sem.try_acquire("second", 60.0)
        finally:
            del vars(reference)["current"]
        released = lease is not None and lease.release()
        again = sem.try_acquire("third", 60.0)
        channel.send((lease is not None, busy, released, again is not None))


def test_a_store_closed_before_a_fork_never_ends_a_step_of_the_childs_own_store(
    shm_url: str,
) -> None:
    closed = open_store(shm_url)
    INHERITED.append(closed._backend.engine)
    closed.close()
    del closed
    try:
        with Processes("fork") as procs:
            child = procs.start(fill_as_the_inherited_store_goes, shm_url)
            assert child.recv(PATIENCE_S) == (True, None, True, True)
    finally:
        INHERITED.clear()
