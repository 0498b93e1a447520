"""The pool scenario of ``orbit demo``: workers share warm TCP connections host-wide.

The demo starts a real TCP echo server. Worker processes join one fleet and
acquire a connection for each request with ``LocalFirst``: their own idle one
(LocalReuse), another worker's over a Unix-socket session to its owner
(RemoteReuse), a new one within the host-wide ``max_live`` (Create), or they
wait. A sampler in the parent and the echo server itself check that live
connections never exceed ``max_live``.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import socket
import socketserver
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Final

from .._errors import MalformedError, OrbitError
from .._fleet import Fleet
from ..pool import (
    Create,
    Execution,
    Key,
    Lease,
    Limits,
    LocalFirst,
    LocalReuse,
    Pool,
    Reject,
    RemoteReuse,
    ResourceId,
    Wait,
)
from ..pool.session import SessionClosed, accept_session, open_session
from ._lock import remove_stopped_fleet_files

MESSAGE: Final = 64
REFUSED: Final = b"\0" * MESSAGE
KEY: Final = Key.digest(b"tcp://127.0.0.1/echo")

#: What the owner does with one accepted session's payload: returns the reply.
Handler = Callable[[Execution, bytes], bytes]


class SessionServer:
    """Serves leases on this process's resources over a Unix socket.

    One thread per borrower connection reads a lease frame, accepts it, reads a
    fixed-size payload, replies with ``handler(execution, payload)`` and
    completes the execution, whatever the borrower does. A refused lease (stale,
    draining, accepted already) gets ``REFUSED`` after its payload is skipped.
    """

    def __init__(self, pool: Pool, path: str, handler: Handler, size: int = MESSAGE) -> None:
        self.pool, self.path, self.handler, self.size = pool, path, handler, size
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a dead predecessor's socket
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError, OrbitError):  # the process may be closing
            while True:
                try:
                    execution = accept_session(self.pool, conn)
                except (SessionClosed, MalformedError):
                    return  # the borrower left, between frames or inside one
                except OrbitError:
                    conn.recv(self.size, socket.MSG_WAITALL)
                    conn.sendall(REFUSED[: self.size])
                    continue
                with execution:
                    payload = conn.recv(self.size, socket.MSG_WAITALL)
                    if len(payload) < self.size:
                        return  # gone mid-payload: the unit still returns
                    conn.sendall(self.handler(execution, payload))

    def close(self) -> None:
        """Stop accepting new borrowers."""
        self.listener.close()


class Borrower:
    """Carries leases to their owners over cached Unix-socket connections."""

    def __init__(self, pool: Pool, path_of: Callable[[int], str]) -> None:
        self.pool = pool
        self.path_of = path_of
        self.connections: dict[int, socket.socket] = {}

    def use(self, lease: Lease, payload: bytes) -> bytes | None:
        """Send ``lease`` and ``payload`` to the owner; its reply, or None on failure.

        A lease the owner provably never accepted (no connection, or refused)
        is cancelled, so no reserved unit is left behind.
        """
        conn = self._connection(lease.id.node)
        reply = b""
        if conn is not None:
            try:
                open_session(lease, conn, payload)
                reply = conn.recv(len(payload), socket.MSG_WAITALL)
            except OSError:
                reply = b""
        if conn is None or reply == REFUSED[: len(payload)]:
            with contextlib.suppress(OrbitError):
                self.pool.cancel_reservation(lease)
            return None
        if len(reply) < len(payload):
            self.forget(lease.id.node)  # the owner died: the death report frees it
            return None
        return reply

    def _connection(self, node: int) -> socket.socket | None:
        conn = self.connections.get(node)
        if conn is None:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.settimeout(30.0)
            try:
                conn.connect(self.path_of(node))
            except OSError:
                conn.close()
                return None
            self.connections[node] = conn
        return conn

    def forget(self, node: int) -> None:
        """Drop the cached connection to ``node``."""
        conn = self.connections.pop(node, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Close every cached connection."""
        for node in list(self.connections):
            self.forget(node)


def socket_path(directory: str, node: int) -> str:
    """Where the owner on ``node`` serves sessions."""
    return os.path.join(directory, f"{node}.sock")


# -- the echo server ----------------------------------------------------------------------


class _EchoHandler(socketserver.BaseRequestHandler):
    server: EchoServer

    def handle(self) -> None:
        self.server.opened()
        try:
            while data := self.request.recv(MESSAGE, socket.MSG_WAITALL):
                self.request.sendall(data)
        finally:
            self.server.closed()


class EchoServer(socketserver.ThreadingTCPServer):
    """A real TCP echo server on 127.0.0.1 that counts concurrent connections."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _EchoHandler)
        self.lock = threading.Lock()
        self.open_count = self.max_open = 0

    def opened(self) -> None:
        with self.lock:
            self.open_count += 1
            self.max_open = max(self.max_open, self.open_count)

    def closed(self) -> None:
        with self.lock:
            self.open_count -= 1


# -- workers ------------------------------------------------------------------------------


@dataclass
class _Worker:
    pool: Pool
    address: tuple[str, int]
    borrower: Borrower
    limits: Limits
    connections: dict[ResourceId, socket.socket] = field(default_factory=dict)
    plans: Counter[str] = field(default_factory=Counter)
    echoed: int = 0
    errors: int = 0

    def echo(self, conn: socket.socket, payload: bytes) -> bytes:
        conn.sendall(payload)
        return conn.recv(MESSAGE, socket.MSG_WAITALL)

    def serve(self, execution: Execution, payload: bytes) -> bytes:
        """Session handler: echo a borrower's payload over our own warm connection."""
        return self.echo(self.connections[execution.id], payload)

    def request(self, payload: bytes) -> None:
        plan = self.pool.acquire(KEY, self.limits, LocalFirst())
        self.plans[type(plan).__name__] += 1
        reply: bytes | None = None
        match plan:
            case LocalReuse(lease):
                with self.pool.accept(lease) as execution:
                    reply = self.echo(self.connections[execution.id], payload)
            case RemoteReuse(lease):
                reply = self.borrower.use(lease, payload)
            case Create(permit):
                with permit:
                    conn = socket.create_connection(self.address, timeout=30.0)
                    rid, execution = self.pool.register_active(KEY, 1)
                self.connections[rid] = conn
                with execution:
                    reply = self.echo(conn, payload)
            case Wait(version):
                self.pool.wait_capacity(KEY, version, timeout=0.2)
                return
            case Reject():
                return
        if reply == payload:
            self.echoed += 1
        else:
            self.errors += reply is not None


def _worker(
    fleet_name: str,
    capacity: int,
    address: tuple[str, int],
    max_live: int,
    directory: str,
    seconds: float,
    stop: Event,
    out: Queue,  # type: ignore[type-arg]
) -> None:
    with Fleet.join(fleet_name, capacity) as fleet, Pool(fleet) as pool:
        path_of = functools.partial(socket_path, directory)
        worker = _Worker(pool, address, Borrower(pool, path_of), Limits(max_live=max_live))
        server = SessionServer(pool, path_of(pool.node), worker.serve)
        payload = os.urandom(MESSAGE)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                worker.request(payload)
            except (OrbitError, OSError):
                worker.errors += 1
        worker.borrower.close()
        out.put((dict(worker.plans), worker.echoed, worker.errors))
        stop.wait(60.0)  # keep serving until every worker is done
        server.close()
        for rid, conn in worker.connections.items():
            with contextlib.suppress(OrbitError):
                pool.unregister(rid)
            conn.close()


# -- the parent ---------------------------------------------------------------------------


class _Sampler:
    """Reads the key's live count from the parent's own Pool until stopped."""

    def __init__(self, pool: Pool) -> None:
        self.pool, self.highest, self.samples = pool, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            live, _ = self.pool.budget(KEY)
            self.highest, self.samples = max(self.highest, live), self.samples + 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_pool_demo(workers: int, seconds: float) -> int:
    """Run the pool scenario and print its summary.

    Args:
        workers: worker processes (>= 1).
        seconds: how long the workers send requests.

    Returns:
        0 if live connections never exceeded ``max_live`` (by the table and by
        the echo server's own count) and every echo came back intact, else 1.
    """
    max_live = max(1, workers // 2)
    name = f"pool-demo-{os.getpid()}"
    context = multiprocessing.get_context("spawn")
    with EchoServer() as echo, tempfile.TemporaryDirectory(prefix="orbit-") as directory:
        threading.Thread(target=echo.serve_forever, daemon=True).start()
        with Fleet.join(name, workers + 1) as fleet, Pool(fleet) as pool:
            stop, out = context.Event(), context.Queue()
            args = (name, workers + 1, echo.server_address, max_live, directory, seconds, stop, out)
            processes = [context.Process(target=_worker, args=args) for _ in range(workers)]
            sampler = _Sampler(pool)
            for process in processes:
                process.start()
            try:
                results = [out.get(timeout=seconds + 120.0) for _ in processes]
            finally:
                sampler.stop()
                stop.set()
                for process in processes:
                    process.join(30.0)
            pool.unlink()
        echo.shutdown()
    remove_stopped_fleet_files(name)
    return _summarise(name, workers, seconds, max_live, results, sampler, echo.max_open)


def _summarise(
    name: str,
    workers: int,
    seconds: float,
    max_live: int,
    results: list[tuple[dict[str, int], int, int]],
    sampler: _Sampler,
    server_max: int,
) -> int:
    plans: Counter[str] = Counter()
    for counts, _, _ in results:
        plans.update(counts)
    echoed = sum(r[1] for r in results)
    errors = sum(r[2] for r in results)
    kinds = ("LocalReuse", "RemoteReuse", "Create", "Wait", "Reject")
    print(f"orbit demo (pool): {workers} workers, {seconds:g} s, fleet {name!r}")
    print(f"  max_live (host-wide)      {max_live}")
    for kind in kinds:
        print(f"  plans {kind:<19} {plans[kind]:>9,}")
    print(f"  echo round trips          {echoed:>9,}  ({echoed / seconds:,.0f}/s)")
    print(f"  errors                    {errors:>9,}")
    print(f"  highest live seen         {sampler.highest:>9,}  ({sampler.samples:,} samples)")
    print(f"  server's most open conns  {server_max:>9,}")
    ok = sampler.highest <= max_live and server_max <= max_live and errors == 0
    verdict = "OK" if ok else "FAILED"
    print(f"verdict: {verdict}, live connections never exceeded max_live {max_live}"
          if ok else f"verdict: {verdict}, limit or echo broken")  # fmt: skip
    return 0 if ok else 1
