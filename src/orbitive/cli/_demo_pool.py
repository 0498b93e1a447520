"""The pool scenario of ``orbit demo``: workers share warm TCP connections host-wide.

The demo starts a real TCP echo server. Worker processes join one fleet and
send each request through a :class:`~orbitive.clients.ClientPool` in remote
mode: it runs on the worker's own idle connection, or on another worker's idle
one (the request travels to its owner over a Unix-socket session), or on a new
connection within the host-wide ``max_live``, or it waits. A sampler in the
parent and the echo server itself check that live connections never exceed
``max_live``.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import socket
import socketserver
import threading
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Final

from .._core._errors import OrbitError
from .._core._fleet import Fleet
from ..clients import ClientPool, PoolOptions
from ..pool import Key, Pool
from . import _children
from ._lock_commands import clear_stopped_fleet

MESSAGE: Final = 64
KEY: Final = Key.digest(b"tcp://127.0.0.1/echo")


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

    def serve(self) -> None:
        """:meth:`serve_forever`, for a thread of its own. A run interrupted while that
        thread started may close the server before it serves: that ends it quietly.

        Raises:
            ValueError: from ``serve_forever`` while the server is open.
        """
        try:
            self.serve_forever()
        except ValueError:  # its socket's descriptor is -1: closed before it was watched
            if self.fileno() != -1:
                raise

    @property
    def address(self) -> tuple[str, int]:
        """The host and port it listens on."""
        host, port = self.socket.getsockname()
        return host, port

    def opened(self) -> None:
        with self.lock:
            self.open_count += 1
            self.max_open = max(self.max_open, self.open_count)

    def closed(self) -> None:
        with self.lock:
            self.open_count -= 1


# -- workers ------------------------------------------------------------------------------


def _connect(address: tuple[str, int]) -> socket.socket:
    return socket.create_connection(address, timeout=30.0)


def _close(conn: socket.socket) -> None:
    """Close once the server has seen the end (it counts the connection closed first)."""
    with contextlib.suppress(OSError), conn:
        conn.shutdown(socket.SHUT_WR)
        while conn.recv(MESSAGE):
            pass


def _echo(conn: socket.socket, payload: bytes) -> bytes:
    """The remote-mode handler: one round trip on a warm connection."""
    conn.sendall(payload)
    return conn.recv(MESSAGE, socket.MSG_WAITALL)


def _worker(
    fleet_name: str,
    capacity: int,
    address: tuple[str, int],
    max_live: int,
    seconds: float,
    stop: Event,
    out: Queue,  # type: ignore[type-arg]
) -> None:
    options = PoolOptions(max_live=max_live, acquire_timeout=30.0)
    with (
        Fleet.join(fleet_name, capacity) as fleet,
        ClientPool(
            fleet, KEY, create=functools.partial(_connect, address), close=_close,
            handler=_echo, options=options,
        ) as pool,
    ):  # fmt: skip
        payload = os.urandom(MESSAGE)
        requests = echoed = errors = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            requests += 1
            try:
                echoed += pool.request(payload) == payload
            except (OrbitError, OSError):
                errors += 1
        stats = pool.statistics()
        out.put((requests, echoed, errors, stats.borrowed_count, stats.created_count,
                 stats.retired_count))  # fmt: skip
        stop.wait(60.0)  # keep serving other workers until every worker is done


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
    print(f"orbit demo (pool): {workers} workers, {seconds:g} s, fleet {name!r}", flush=True)
    try:
        with EchoServer() as echo:
            serving = threading.Thread(target=echo.serve, daemon=True)
            try:
                serving.start()
                results, sampler = _run(name, workers, echo.address, max_live, seconds)
            finally:  # interrupted too: a started serving loop ends before the socket closes
                if serving.ident is not None:
                    echo.shutdown()
    finally:  # also when interrupted, or when the reader of its output went away
        clear_stopped_fleet(name)
    return _summarise(workers, seconds, max_live, results, sampler, echo.max_open)


def _run(
    name: str, workers: int, address: tuple[str, int], max_live: int, seconds: float
) -> tuple[list[tuple[int, int, int, int, int, int]], _Sampler]:
    """The workers' results, and the sampler that watched the key's live count."""
    context = multiprocessing.get_context("spawn")
    with Fleet.join(name, workers + 1) as fleet, Pool(fleet) as pool:
        stop, out = context.Event(), context.Queue()
        args = (name, workers + 1, address, max_live, seconds, stop, out)
        processes = [context.Process(target=_worker, args=args) for _ in range(workers)]
        sampler = _Sampler(pool)
        try:
            for process in processes:
                _children.start(process)
            results = [out.get(timeout=seconds + 120.0) for _ in processes]
        except BaseException:
            _children.end(processes, 0.0)  # interrupted: the workers stop now
            raise
        finally:
            sampler.stop()
            stop.set()
            _children.end(processes, 30.0)
    return results, sampler


def _summarise(
    workers: int,
    seconds: float,
    max_live: int,
    results: list[tuple[int, int, int, int, int, int]],
    sampler: _Sampler,
    server_max: int,
) -> int:
    columns = (sum(column) for column in zip(*results, strict=True))
    requests, echoed, errors, borrowed, created, retired = columns
    print(f"  max_live (host-wide)      {max_live:>9,}")
    print(f"  requests                  {requests:>9,}  ({requests / seconds:,.0f}/s)")
    print(f"  on the worker's own conn  {requests - borrowed - errors:>9,}")
    print(f"  on another worker's conn  {borrowed:>9,}  (over a Unix-socket session)")
    print(f"  connections created       {created:>9,}  (retired: {retired:,})")
    print(f"  echo round trips          {echoed:>9,}")
    print(f"  errors                    {errors:>9,}")
    print(f"  highest live seen         {sampler.highest:>9,}  ({sampler.samples:,} samples)")
    print(f"  server's most open conns  {server_max:>9,}")
    ok = sampler.highest <= max_live and server_max <= max_live and errors == 0
    ok = ok and echoed == requests
    verdict = "OK" if ok else "FAILED"
    print(f"verdict: {verdict}, live connections never exceeded max_live {max_live}"
          if ok else f"verdict: {verdict}, limit or echo broken")  # fmt: skip
    return 0 if ok else 1
