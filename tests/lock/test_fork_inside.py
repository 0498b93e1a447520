"""Forks while other threads are inside the C operations and the Python ones.

Two threads of one process churn one key, one through the C operations and
one through the Python ones (``_bind(None)``) on a second table of the same
fleet; the main thread forks again and again. Each child must use the
inherited table and a new one at once (no section, process mutex or ring lane
left locked by a parent's thread), and the parent's table stays usable.
"""

from __future__ import annotations

import os
import threading

from orbitive import Fleet
from orbitive.lock import Acquired, LockKey, LockOwner, LockTable

from .._children import KEY
from .._processes import Channel, Processes

FORKS = 25
CHILD_KEY = LockKey("tests.fork", "child")


def churn(table: LockTable, stop: threading.Event) -> None:
    owner = LockOwner(f"thread-{threading.get_native_id()}")
    while not stop.is_set():
        result = table.try_acquire(KEY, owner, 30.0)
        if isinstance(result, Acquired):
            table.renew(result.lease, 30.0)
            table.release(result.lease)


def use_in_child(channel: Channel, tables: list[LockTable], fleet_name: str) -> None:
    outcomes = []
    for table in [*tables, LockTable(Fleet.join(fleet_name, 8))]:
        result = table.try_acquire(CHILD_KEY, LockOwner(f"child-{os.getpid()}"), 30.0)
        outcomes.append(type(result).__name__)
        if isinstance(result, Acquired):
            assert table.release(result.lease)
        table.current(KEY)
    channel.send(outcomes)


def test_forks_while_threads_are_inside_either_operation_leave_the_child_usable(
    fleet_name: str,
) -> None:
    fleet = Fleet.join(fleet_name, 8)
    fast, slow = LockTable(fleet), LockTable(fleet)
    slow._bind(None)
    stop = threading.Event()
    threads = [threading.Thread(target=churn, args=(table, stop)) for table in (fast, slow)]
    for thread in threads:
        thread.start()
    try:
        with Processes("fork") as processes:
            for _ in range(FORKS):
                child = processes.start(use_in_child, [fast, slow], fleet_name)
                assert child.recv(timeout=20.0) == ["Acquired"] * 3
                assert child.wait() == 0
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert isinstance(fast.try_acquire(KEY, LockOwner(b"after"), 30.0), Acquired)
    fleet.close()
