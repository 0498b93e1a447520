"""A pool member in another process, driven over a pipe (fork or spawn).

The child joins the fleet, opens a Pool and runs one command per message,
keeping Executions and CreationPermits in a handle table so the test process
can complete or drop them later. Errors travel back pickled (every OrbitError
survives pickling) and are re-raised in the test process.
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.context import ForkContext, SpawnContext
from multiprocessing.process import BaseProcess
from typing import Any

from orbitive import Fleet
from orbitive._core._readiness import BACKEND
from orbitive.pool import (
    POOL_KIND,
    CreationPermit,
    Execution,
    Incarnation,
    Key,
    Lease,
    Pool,
    ResourceId,
)
from orbitive.pool._availability import add_waiter

Context = ForkContext | SpawnContext
Handles = dict[int, Execution | CreationPermit]


def _register_active(pool: Pool, handles: Handles, key: Key, capacity: int) -> tuple[Any, int]:
    rid, execution = pool.register_active(key, capacity)
    handles[len(handles) + 1] = execution
    return rid, len(handles)


def _accept(pool: Pool, handles: Handles, lease: Lease) -> int:
    handles[len(handles) + 1] = pool.accept(lease)
    return len(handles)


def _claim(pool: Pool, handles: Handles, key: Key, max_live: int) -> int:
    handles[len(handles) + 1] = pool.claim_create(key, max_live)
    return len(handles)


def _complete(pool: Pool, handles: Handles, handle: int) -> None:
    item = handles.pop(handle)
    if isinstance(item, Execution):
        item.complete()
    else:
        item.finish()


def _drop(pool: Pool, handles: Handles, handle: int) -> None:
    del handles[handle]  # a permit returns its claim when dropped


def _wait(pool: Pool, handles: Handles, key: Key, since: int, timeout: float | None) -> Any:
    started = time.monotonic()
    version = pool.wait_capacity(key, since, timeout)
    return version, time.monotonic() - started


def _wait_cpu(pool: Pool, handles: Handles, key: Key, since: int, timeout: float) -> Any:
    """Like ``wait``, plus the CPU seconds the waiting thread and the process spent."""
    thread_before = time.thread_time()
    usage_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.monotonic()
    version = pool.wait_capacity(key, since, timeout)
    elapsed = time.monotonic() - started
    thread_cpu = time.thread_time() - thread_before
    usage = resource.getrusage(resource.RUSAGE_SELF)
    process_cpu = (usage.ru_utime - usage_before.ru_utime) + (
        usage.ru_stime - usage_before.ru_stime
    )
    return version, elapsed, thread_cpu, process_cpu


def _hold(pool: Pool, handles: Handles, seconds: float) -> None:
    time.sleep(seconds)


OPS: dict[str, Callable[..., Any]] = {
    "register": lambda pool, handles, key, cap: pool.register(key, cap),
    "register_active": _register_active,
    "reserve": lambda pool, handles, rid: pool.reserve(rid),
    "cancel": lambda pool, handles, lease: pool.cancel_reservation(lease),
    "accept": _accept,
    "complete": _complete,
    "drop": _drop,
    "claim": _claim,
    "unregister": lambda pool, handles, rid: pool.unregister(rid),
    "drain": lambda pool, handles, rid: pool.drain(rid),
    "candidates": lambda pool, handles, key: pool.candidates(key),
    "budget": lambda pool, handles, key: pool.budget(key),
    "version": lambda pool, handles, key: pool.version(key),
    "add_waiter": lambda pool, handles, key, delta: add_waiter(pool._t(), key, delta),
    "acquire": lambda pool, handles, key, limits: pool.acquire(key, limits),
    "wait": _wait,
    "wait_cpu": _wait_cpu,
    "backend": lambda pool, handles: BACKEND.NAME,
    "hold": _hold,
    "identity": lambda pool, handles: (pool.node, pool.incarnation, os.getpid()),
}


def serve(conn: Connection, fleet_name: str, capacity: int, options: dict[str, int]) -> None:
    """The child's loop: one command per message until None or EOF.

    ``options`` are keyword arguments of ``Pool`` (kind, key_capacity, lane_capacity).
    """
    with (
        Fleet.join(fleet_name, capacity) as fleet,
        Pool(
            fleet,
            kind=options.get("kind", POOL_KIND),
            key_capacity=options.get("key_capacity"),
            lane_capacity=options.get("lane_capacity"),
        ) as pool,
    ):
        handles: Handles = {}
        conn.send(("ok", (fleet.node, fleet.incarnation, os.getpid())))
        while True:
            try:
                message = conn.recv()
            except EOFError:
                break
            if message is None:
                break
            op, args = message
            try:
                conn.send(("ok", OPS[op](pool, handles, *args)))
            except Exception as error:
                conn.send(("err", error))


class Agent:
    """The test process's end of one member process (``options``: Pool keyword arguments)."""

    def __init__(self, context: Context, fleet_name: str, capacity: int, **options: int) -> None:
        self.conn, child = context.Pipe()
        self.process: BaseProcess = context.Process(
            target=serve, args=(child, fleet_name, capacity, options), daemon=True
        )
        self.process.start()
        child.close()
        self.node, self.incarnation, self.pid = self._reply(30.0)

    def send(self, op: str, *args: object) -> None:
        """Start a command without waiting for its reply."""
        self.conn.send((op, args))

    def _reply(self, timeout: float) -> Any:
        if not self.conn.poll(timeout):
            raise TimeoutError(f"agent {self.process.pid} did not answer in {timeout} s")
        status, value = self.conn.recv()
        if status == "err":
            raise value
        return value

    def reply(self, timeout: float = 30.0) -> Any:
        """The reply to the oldest command sent; re-raises the child's error."""
        return self._reply(timeout)

    def call(self, op: str, *args: object, timeout: float = 30.0) -> Any:
        """Run one command and return its result (or raise its error)."""
        self.send(op, *args)
        return self.reply(timeout)

    def stop(self) -> None:
        """Ask the child to leave, then make sure it is gone."""
        if self.process.is_alive():
            with contextlib.suppress(OSError, BrokenPipeError):
                self.conn.send(None)
            self.process.join(10.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10.0)
        self.conn.close()


def rid_of(value: Any) -> ResourceId:
    """Narrow an agent reply to a ResourceId."""
    assert isinstance(value, ResourceId)
    return value


def explicit_life_member(channel: Any, fleet_name: str, capacity: int, key: Key) -> None:
    """Join, open a Pool with an explicit incarnation (7), register one resource of ``key``,
    send (node, 7) through ``channel`` (a ``tests._processes.Channel``), then wait."""
    with Fleet.join(fleet_name, capacity) as fleet, Pool(fleet, Incarnation(7)) as pool:
        pool.register(key, 1)
        channel.send((fleet.node, pool.incarnation))
        time.sleep(3600)
