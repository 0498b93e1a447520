"""Processes of the no-over-admission test: one owner serving sessions, many borrowers.

The owner registers one resource and serves every lease over a Unix-socket
session (the demo's SessionServer): it accepts, holds the unit a moment and
completes. Borrowers reserve in a loop; a reserve either succeeds (the lease is
carried to the owner and used) or raises BusyError (the borrower then waits for
the key to change). Each side reports its counts through a queue.
"""

from __future__ import annotations

import random
import threading
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event

from orbitive import Fleet
from orbitive._core._errors import BusyError
from orbitive.pool import Execution, Key, Pool, ResourceId

from ._sessions import MESSAGE, Borrower, SessionServer, socket_path

#: Longest a unit is held by the owner (seconds); the shortest is a tenth of it.
HOLD = 0.002


class _Counting:
    """The owner's session handler: counts accepted executions, holds each briefly."""

    def __init__(self, seed: int) -> None:
        self.lock = threading.Lock()
        self.accepted = 0
        self.random = random.Random(seed)

    def __call__(self, execution: Execution, payload: bytes) -> bytes:
        with self.lock:
            self.accepted += 1
            hold = self.random.uniform(HOLD / 10, HOLD)
        time.sleep(hold)
        return payload


def owner(
    fleet_name: str,
    capacity: int,
    key_value: int,
    units: int,
    directory: str,
    finish: Event,
    out: Queue,  # type: ignore[type-arg]
) -> None:
    """Register one resource of ``units`` units and serve its leases until ``finish``.

    Puts ``("ready", rid)`` first, then ``("served", accepted)`` after ``finish``.
    """
    with Fleet.join(fleet_name, capacity) as fleet, Pool(fleet) as pool:
        handler = _Counting(pool.node)
        server = SessionServer(pool, socket_path(directory, pool.node), handler)
        rid = pool.register(Key(key_value), units)
        out.put(("ready", rid))
        finish.wait(120.0)
        server.close()
        with handler.lock:
            out.put(("served", handler.accepted))
        pool.unregister(rid)


def borrower(
    fleet_name: str,
    capacity: int,
    key_value: int,
    rid: ResourceId,
    attempts: int,
    directory: str,
    start: Event,
    out: Queue,  # type: ignore[type-arg]
) -> None:
    """Try ``attempts`` reserves of ``rid``; use each lease through the owner.

    Puts ``("joined", node)`` first, then ``("done", reserved, busy, failed)``:
    reserves that succeeded, reserves refused with BusyError, and leases the
    owner did not serve (refused, or a wrong echo).
    """
    key = Key(key_value)
    payload = bytes(range(MESSAGE))
    with Fleet.join(fleet_name, capacity) as fleet, Pool(fleet) as pool:
        carrier = Borrower(pool, lambda node: socket_path(directory, node))
        pool.version(key)  # map the table and install the key before the start line
        out.put(("joined", pool.node))
        start.wait(120.0)
        reserved = busy = failed = 0
        for _ in range(attempts):
            since = pool.version(key)
            try:
                lease = pool.reserve(rid)
            except BusyError:
                busy += 1
                pool.wait_capacity(key, since, timeout=0.5)
                continue
            reserved += 1
            failed += carrier.use(lease, payload) != payload
        carrier.close()
        out.put(("done", reserved, busy, failed))
