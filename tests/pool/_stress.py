"""A stress worker: acquire, use (locally or over a session to the owner), repeat.

Sessions go through the demo's SessionServer and Borrower. The victim stops
after some cycles while holding a unit (mid-lease) and waits to be killed.
"""

from __future__ import annotations

import contextlib
import functools
import random
import socket
import time
from collections.abc import Sequence
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event

from orbitive import Fleet
from orbitive._core._errors import OrbitError
from orbitive.pool import (
    Candidate,
    Create,
    Decision,
    Execution,
    Key,
    Limits,
    LocalReuse,
    Pool,
    RemoteReuse,
    ResourceId,
    Wait,
)
from orbitive.pool.session import open_session

from ._sessions import MESSAGE, Borrower, SessionServer, socket_path

PAYLOAD = b"p" * MESSAGE


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


class _State:
    def __init__(self, pool: Pool, key: Key, limits: Limits, directory: str) -> None:
        self.pool, self.key, self.limits = pool, key, limits
        self.borrower = Borrower(pool, functools.partial(socket_path, directory))
        self.policy = Spread(pool.node)
        self.plans: dict[str, int] = {}
        self.owned: list[ResourceId] = []

    def cycle(self) -> bool:
        """One acquire and its use; True if a unit was used."""
        pool = self.pool
        if self.owned and self.policy.random.random() < 0.03:
            pool.unregister(self.owned.pop(0))  # retire one: churn the budget
        plan = pool.acquire(self.key, self.limits, self.policy)
        self.plans[type(plan).__name__] = self.plans.get(type(plan).__name__, 0) + 1
        match plan:
            case LocalReuse(lease):
                with pool.accept(lease):
                    return True
            case RemoteReuse(lease):
                return self.borrower.use(lease, PAYLOAD) == PAYLOAD
            case Create(permit):
                with permit:
                    rid, execution = pool.register_active(self.key, 1)
                self.owned.append(rid)
                execution.complete()
                return True
            case Wait(version):
                pool.wait_capacity(self.key, version, timeout=0.2)
        return False

    def hold_a_unit(self, directory: str) -> object:
        """Take one unit and keep it: an execution, or a session cut mid-payload."""
        while True:
            match self.pool.acquire(self.key, self.limits):
                case LocalReuse(lease):
                    return self.pool.accept(lease)
                case RemoteReuse(lease):
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    sock.connect(socket_path(directory, lease.id.node))
                    open_session(lease, sock, PAYLOAD[:5])  # the owner accepts, then waits
                    return sock
                case Create(permit):
                    with permit:
                        return self.pool.register_active(self.key, 1)
                case Wait(version):
                    self.pool.wait_capacity(self.key, version, timeout=0.2)


def _echo(execution: Execution, payload: bytes) -> bytes:
    return payload


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
        server = SessionServer(pool, socket_path(directory, pool.node), _echo)
        out.put(("ready", pool.node))
        start.wait(120.0)
        state = _State(pool, Key(key_value), Limits(max_live=max_live, attempts=4), directory)
        done = 0
        while done < (cycles // 3 if victim else cycles):
            done += state.cycle()
        if victim:
            held = state.hold_a_unit(directory)
            holding.set()
            time.sleep(120.0)  # until killed; never wait on `finish` (a dead waiter blocks set())
            del held
            return
        out.put(("done", done, state.plans))
        finish.wait(120.0)
        server.close()
        for rid in state.owned:
            with contextlib.suppress(OrbitError):
                pool.unregister(rid)
