"""A stress worker: acquire, use (locally or over a session to the owner), repeat.

Each worker owns the resources it creates and serves leases on them over a Unix
socket, one thread per borrower connection. The victim stops after some cycles
while holding a unit (mid-lease) and waits to be killed.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
import time
from collections.abc import Sequence
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event

from orbitive import Fleet
from orbitive._errors import MalformedError, OrbitError
from orbitive.pool import (
    Candidate,
    Create,
    Decision,
    Key,
    Lease,
    Limits,
    LocalReuse,
    Pool,
    RemoteReuse,
    ResourceId,
    Wait,
)
from orbitive.pool.session import accept_session, open_session

PAYLOAD = b"p" * 16
REPLY = b"r" * 16
REFUSED = b"n" * 16


def socket_path(directory: str, node: int) -> str:
    """Where the owner on ``node`` serves sessions."""
    return os.path.join(directory, f"{node}.sock")


def _serve_connection(pool: Pool, conn: socket.socket) -> None:
    with conn, contextlib.suppress(OSError, OrbitError):  # the worker may be closing
        while True:
            try:
                execution = accept_session(pool, conn)
            except MalformedError:
                return  # a short frame: the borrower left
            except OrbitError:  # stale, draining, not reserved: nothing accepted
                conn.recv(len(PAYLOAD), socket.MSG_WAITALL)  # skip this session's payload
                conn.sendall(REFUSED)
                continue
            with execution:  # the unit returns whatever the borrower does
                if conn.recv(len(PAYLOAD), socket.MSG_WAITALL) != PAYLOAD:
                    return
                conn.sendall(REPLY)


def _serve(pool: Pool, listener: socket.socket) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_serve_connection, args=(pool, conn), daemon=True).start()


class Borrower:
    """Cached session connections to other owners."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.connections: dict[int, socket.socket] = {}

    def use(self, pool: Pool, lease: Lease, payload: bytes = PAYLOAD) -> bool:
        """Carry ``lease`` to its owner and wait for the reply; False on any failure.

        A lease the owner provably never accepted (no connection, or refused) is
        cancelled: transport rollback, so no reserved unit is left behind.
        """
        node = lease.id.node
        conn = self.connections.get(node)
        try:
            if conn is None:
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conn.settimeout(30.0)
                conn.connect(socket_path(self.directory, node))
                self.connections[node] = conn
        except OSError:
            conn = None
        if conn is None:
            with contextlib.suppress(OrbitError):
                pool.cancel_reservation(lease)
            return False
        try:
            open_session(lease, conn, payload)
            if len(payload) < len(PAYLOAD):
                return True
            reply = conn.recv(len(REPLY), socket.MSG_WAITALL)
        except OSError:
            reply = b""
        if reply == REFUSED:
            with contextlib.suppress(OrbitError):
                pool.cancel_reservation(lease)
        elif reply != REPLY:
            self.forget(node)  # the owner is gone: its resources go with the death report
        return reply == REPLY

    def forget(self, node: int) -> None:
        """Drop the connection to ``node``."""
        conn = self.connections.pop(node, None)
        if conn is not None:
            conn.close()


class Spread:
    """Sometimes create while the budget allows, else reuse any free unit at random."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)

    def decide(
        self, key: Key, candidates: Sequence[Candidate], budget: tuple[int, int], limits: Limits
    ) -> Decision:
        room = sum(budget) < limits.max_live
        if room and self.random.random() < 0.2:
            return Decision.create()
        usable = [c for c in candidates if c.state == "live" and c.free > 0]
        if usable:
            return Decision.reuse(self.random.choice(usable).id)
        return Decision.create() if room else Decision.wait()


def _cycle(pool: Pool, key: Key, limits: Limits, borrower: Borrower, state: _State) -> bool:
    """One acquire and its use; True if a unit was used."""
    if state.owned and state.policy.random.random() < 0.03:
        pool.unregister(state.owned.pop(0))  # retire one: churn the budget
    plan = pool.acquire(key, limits, state.policy)
    state.plans[type(plan).__name__] = state.plans.get(type(plan).__name__, 0) + 1
    match plan:
        case LocalReuse(lease):
            with pool.accept(lease):
                return True
        case RemoteReuse(lease):
            return borrower.use(pool, lease)
        case Create(permit):
            with permit:
                rid, execution = pool.register_active(key, 1)
            state.owned.append(rid)
            execution.complete()
            return True
        case Wait(version):
            pool.wait_capacity(key, version, timeout=0.2)
    return False


class _State:
    def __init__(self, seed: int) -> None:
        self.policy = Spread(seed)
        self.plans: dict[str, int] = {}
        self.owned: list[ResourceId] = []


def _hold_a_unit(pool: Pool, key: Key, limits: Limits, borrower: Borrower) -> object:
    """Take one unit and keep it: an execution, or a session cut mid-payload."""
    while True:
        match pool.acquire(key, limits):
            case LocalReuse(lease):
                return pool.accept(lease)
            case RemoteReuse(lease):
                if borrower.use(pool, lease, PAYLOAD[:5]):
                    return lease
            case Create(permit):
                with permit:
                    return pool.register_active(key, 1)
            case Wait(version):
                pool.wait_capacity(key, version, timeout=0.2)


def stress_worker(
    fleet_name: str,
    capacity: int,
    key_value: int,
    max_live: int,
    cycles: int,
    directory: str,
    victim: bool,
    start: Event,
    holding: Event,
    finish: Event,
    out: Queue,  # type: ignore[type-arg]
) -> None:
    """Run ``cycles`` used units (the victim: a third of them, then hold one)."""
    with Fleet.join(fleet_name, capacity) as fleet, Pool(fleet) as pool:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket_path(directory, pool.node))  # a dead predecessor's
        listener.bind(socket_path(directory, pool.node))
        listener.listen(16)
        threading.Thread(target=_serve, args=(pool, listener), daemon=True).start()
        out.put(("ready", pool.node))
        start.wait(120.0)
        key, limits = Key(key_value), Limits(max_live=max_live, attempts=4)
        borrower, state = Borrower(directory), _State(pool.node)
        done = 0
        while done < (cycles // 3 if victim else cycles):
            done += _cycle(pool, key, limits, borrower, state)
        if victim:
            held = _hold_a_unit(pool, key, limits, borrower)
            holding.set()
            time.sleep(120.0)  # until killed; never wait on `finish` (a dead waiter blocks set())
            del held
            return
        out.put(("done", done, state.plans))
        finish.wait(120.0)
        for rid in state.owned:
            with contextlib.suppress(OrbitError):
                pool.unregister(rid)
        listener.close()
