"""A session server and borrower over Unix sockets, for the pool's multi-process tests.

The owner side serves leases on its resources: one thread per borrower
connection reads a lease frame, accepts it, reads a fixed-size payload, replies
with ``handler(execution, payload)`` and completes the execution. The borrower
carries leases to their owners over cached connections.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable
from typing import Final

from orbitive._core._errors import MalformedError, OrbitError
from orbitive.pool import Execution, Lease, Pool
from orbitive.pool.session import SessionClosed, accept_session, open_session

MESSAGE: Final = 64
REFUSED: Final = b"\0" * MESSAGE

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
