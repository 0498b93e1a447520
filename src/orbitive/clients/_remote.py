"""Remote mode: a request may run on another process's idle client, over a session.

For request/response protocols (an HTTP/1 connection, a Redis connection) a
request need not run on a client of its own process. ``pool.request(payload)``
runs ``handler(client, payload) -> bytes`` on, in this order: an idle client
of this process; another process's idle client, by reserving its unit and
carrying the lease and the payload to the owner over a Unix socket; a new
client within ``max_live``; or it waits. The owner accepts the lease
(:func:`~orbitive.pool.session.accept_session`), runs the handler on its own
client, replies and completes the unit: the client stays where it is, the
user writes no framing, socket paths or lease handling.

After the 48-byte lease frame the borrower sends ``u32 length, payload``; the
owner answers ``u8 status, u32 length, body``: status 0 is the reply, 1 the
handler's error text (:class:`~orbitive.clients.RemoteRequestError`), 2 the
lease refused (the borrower tries another way). Each owner listens on
``{lock dir}/orbit-{fleet}-{kind}-clients-{node}-{key prefix}.sock`` (the
lock directory is mode 0700).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import socket
import stat
import struct
import threading
import time
from typing import TYPE_CHECKING, Any, Final

from .._core._access import euid
from .._core._bytes import exact_bytes
from .._core._errors import (
    AccessDenied,
    BusyError,
    DrainingError,
    InvalidPoolOptions,
    MalformedError,
    OrbitError,
    RemoteRequestError,
    SessionClosed,
    StaleError,
    shown,
)
from .._core._region import SHM_DIR, client_socket_name
from ..pool import Lease, ResourceId
from ..pool.session import accept_session, accept_session_async, open_session, open_session_async
from ._async import made, retire, usable
from ._callbacks import call_async, call_sync
from ._checkout import deadline, start_waiting, stop_waiting, time_left
from ._entry import Entry

if TYPE_CHECKING:
    from ._client_pool import ClientPool

LENGTH: Final = struct.Struct("<I")
REPLY: Final = struct.Struct("<BI")
OK: Final = 0
FAILED: Final = 1
REFUSED: Final = 2
#: Largest request or reply, in bytes.
MESSAGE_MAX: Final = 64 << 20
#: Seconds a borrower waits for an owner's reply at most.
REPLY_TIMEOUT_S: Final = 30.0


def socket_path(pool: ClientPool[Any], node: int) -> str:
    """Where the owner on ``node`` serves remote requests for ``pool``'s key.

    In ``/dev/shm`` beside the fleet's objects, named by user id, so every member
    finds it whatever its environment; the sticky folder keeps other users from
    removing it, and :func:`ours` refuses one another user planted.
    """
    table = pool.pool
    key = str(pool.key)[:12]
    return str(SHM_DIR / client_socket_name(table._fleet.name, table.kind, node, key))


def ours(path: str) -> bool:
    """Whether ``path`` is a socket of this user (not a file or a socket another user planted)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISSOCK(info.st_mode) and info.st_uid == euid()


def check_payload(payload: object) -> bytes:
    """``payload`` as bytes.

    Raises:
        InvalidPoolOptions: not bytes-like (or a released memoryview), or longer
            than :data:`MESSAGE_MAX`.
    """
    data = exact_bytes(payload)
    if data is None:
        raise InvalidPoolOptions(
            f"a request must be readable bytes, got {shown(payload)}", key="payload"
        )
    if len(data) > MESSAGE_MAX:
        raise InvalidPoolOptions(f"a request has at most {MESSAGE_MAX} bytes", key="payload")
    return data


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            raise SessionClosed("the peer closed the session inside a message")
        data += more
    return data


def _answer(status: int, body: bytes) -> bytes:
    return REPLY.pack(status, len(body)) + body


def _reply(status: int, body: bytes) -> bytes | None:
    """The borrower's reading of an answer: the reply, None (refused), or the error."""
    if status == OK:
        return body
    if status == REFUSED:
        return None
    raise RemoteRequestError(f"the owner's handler failed: {body.decode(errors='replace')}")


# -- the owner --------------------------------------------------------------------------


class Server:
    """The owner's side: a Unix socket, one thread per borrower connection."""

    def __init__(self, pool: ClientPool[Any]) -> None:
        self.pool = pool
        self.path = socket_path(pool, pool.pool.node)
        if os.path.lexists(self.path):
            if not ours(self.path):
                raise AccessDenied(f"{self.path!r} is not a socket of ours; refusing it")
            os.unlink(self.path)  # a dead predecessor's socket: this node is ours now
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        os.chmod(self.path, 0o600)
        self.listener.listen(64)
        threading.Thread(target=self._accept_loop, name="orbit-clients-serve", daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError, SessionClosed, MalformedError):
            try:
                execution = accept_session(self.pool.pool, conn)
            except OrbitError:  # stale, draining, replayed: nothing was accepted
                conn.sendall(_answer(REFUSED, b""))
                return
            with execution:
                (size,) = LENGTH.unpack(_recv_exactly(conn, LENGTH.size))
                if size > MESSAGE_MAX:
                    return  # not a borrower of ours: the unit returns, nothing runs
                request = _recv_exactly(conn, size)
                conn.sendall(self._run(execution.id, request))

    def _run(self, rid: ResourceId, request: bytes) -> bytes:
        entry = lend(self.pool, rid)
        if entry is None:
            return _answer(REFUSED, b"")
        try:
            return _answer(
                OK, bytes(call_sync("handler", self.pool.serving, entry.client, request))
            )
        except Exception as error:  # the borrower gets the error's text
            return _answer(FAILED, repr(error).encode()[:4096])
        finally:
            if not lent_back(self.pool, entry):
                self.pool._retire(entry)

    def close(self) -> None:
        """Stop listening and remove the socket."""
        self.listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class AsyncServer:
    """The owner's side for a coroutine handler: an asyncio Unix server on the pool's loop."""

    def __init__(self, pool: ClientPool[Any]) -> None:
        self.pool = pool
        self.path = socket_path(pool, pool.pool.node)
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        """Listen on this loop (once)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.server = await asyncio.start_unix_server(self._serve, self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                execution = await accept_session_async(self.pool.pool, reader)
            except (SessionClosed, MalformedError):
                return
            except OrbitError:
                writer.write(_answer(REFUSED, b""))
                await writer.drain()
                return
            with execution:
                (size,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
                if size > MESSAGE_MAX:
                    return
                request = await reader.readexactly(size)
                writer.write(await self._run(execution.id, request))
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def _run(self, rid: ResourceId, request: bytes) -> bytes:
        entry = lend(self.pool, rid)
        if entry is None:
            return _answer(REFUSED, b"")
        try:
            return _answer(OK, bytes(await call_async(self.pool.serving, entry.client, request)))
        except Exception as error:
            return _answer(FAILED, repr(error).encode()[:4096])
        finally:
            if not lent_back(self.pool, entry):
                await retire(self.pool, entry)

    def close(self) -> None:
        """Stop listening and remove the socket."""
        if self.server is not None:
            self.server.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def lend(pool: ClientPool[Any], rid: ResourceId) -> Entry[Any] | None:
    """The idle entry a borrower's accepted lease names, out of the idle list while its
    request runs (so close() does not close it under the handler)."""
    with pool._lock:
        for entry in pool._idle:
            if entry.rid == rid:
                pool._idle.remove(entry)
                return entry
    return None


def lent_back(pool: ClientPool[Any], entry: Entry[Any]) -> bool:
    """A :func:`lend` entry idle again (oldest first: its unit completes just after);
    False once the pool is closed, and the caller retires it."""
    with pool._lock:
        if pool._closed:
            return False
        entry.idle_since = time.monotonic()
        pool._idle.insert(0, entry)
    return True


async def serve_async(pool: ClientPool[Any]) -> None:
    """Start the owner's asyncio server on this loop (coroutine handlers, once)."""
    server = pool._server
    if isinstance(server, AsyncServer) and server.server is None:
        await server.start()


def start_server(pool: ClientPool[Any]) -> Server | AsyncServer | None:
    """The owner's server for ``pool``'s handler (an AsyncServer starts on first async use)."""
    handler = pool._handler
    if handler is None:
        return None
    if inspect.iscoroutinefunction(handler):
        return AsyncServer(pool)
    return Server(pool)


# -- the borrower -----------------------------------------------------------------------


def _leases(pool: ClientPool[Any]) -> list[Lease]:
    """Reserve one unit of another process's idle client (at most one lease)."""
    for candidate in pool.pool.candidates(pool.key):
        if candidate.local or candidate.state != "live" or candidate.free <= 0:
            continue
        try:
            return [pool.pool.reserve(candidate.id)]
        except (BusyError, StaleError, DrainingError):
            continue
    return []


def borrow(pool: ClientPool[Any], request: bytes) -> bytes | None:
    """Run ``request`` on another process's idle client; None when none could serve it.

    Raises:
        RemoteRequestError: the owner's handler raised.
    """
    for lease in _leases(pool):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(REPLY_TIMEOUT_S)
        with sock:
            path = socket_path(pool, lease.id.node)
            try:
                if not ours(path):
                    raise ConnectionRefusedError(path)
                sock.connect(path)
            except OSError:
                with contextlib.suppress(OrbitError):
                    pool.pool.cancel_reservation(lease)  # never delivered: take it back
                return None
            try:
                open_session(lease, sock, LENGTH.pack(len(request)) + request)
                status, size = REPLY.unpack(_recv_exactly(sock, REPLY.size))
                body = _recv_exactly(sock, size)
            except (OSError, SessionClosed):
                return None  # the owner completes (or died): its unit is its own
            pool.counters.borrowed += 1
            return _reply(status, body)
    return None


async def borrow_async(pool: ClientPool[Any], request: bytes) -> bytes | None:
    """Asyncio twin of :func:`borrow`.

    Raises:
        RemoteRequestError: the owner's handler raised.
    """
    for lease in _leases(pool):
        path = socket_path(pool, lease.id.node)
        try:
            if not ours(path):
                raise ConnectionRefusedError(path)
            reader, writer = await asyncio.open_unix_connection(path)
        except OSError:
            with contextlib.suppress(OrbitError):
                pool.pool.cancel_reservation(lease)
            return None
        try:
            await open_session_async(lease, writer, LENGTH.pack(len(request)) + request)
            status, size = REPLY.unpack(await reader.readexactly(REPLY.size))
            body = await asyncio.wait_for(reader.readexactly(size), REPLY_TIMEOUT_S)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            return None
        finally:
            writer.close()
        pool.counters.borrowed += 1
        return _reply(status, body)
    return None


# -- a request, end to end --------------------------------------------------------------


def request(pool: ClientPool[Any], payload: object, timeout: float | None) -> bytes:
    """:meth:`ClientPool.request`: ours, theirs, a new one, or wait (see the module)."""
    data = check_payload(payload)
    end = deadline(pool, timeout)
    version: int | None = None
    try:
        while True:
            pool._local()
            entry = pool._take_idle()
            if entry is not None:
                if pool._usable(entry):
                    return _here(pool, entry.client, data)
                continue
            reply = borrow(pool, data)
            if reply is not None:
                return reply
            permit = pool._claim()
            if permit is not None:
                return _here(pool, pool._registered(permit, pool._made(permit)).client, data)
            if version is None:
                version = start_waiting(pool)
                continue
            changed = pool.pool.wait_capacity(pool.key, version, time_left(pool, end))
            version = pool.pool.version(pool.key) if changed is None else changed
    finally:
        if version is not None:
            stop_waiting(pool)


def _here(pool: ClientPool[Any], client: object, data: bytes) -> bytes:
    try:
        return bytes(call_sync("handler", pool.serving, client, data))
    finally:
        pool.putconn(client)


async def request_async(pool: ClientPool[Any], payload: object, timeout: float | None) -> bytes:
    """Asyncio twin of :func:`request`."""
    data = check_payload(payload)
    await serve_async(pool)
    end = deadline(pool, timeout)
    version: int | None = None
    try:
        while True:
            pool._local()
            entry = pool._take_idle()
            if entry is not None:
                if await usable(pool, entry):
                    return await _here_async(pool, entry.client, data)
                continue
            reply = await borrow_async(pool, data)
            if reply is not None:
                return reply
            permit = pool._claim()
            if permit is not None:
                client = pool._registered(permit, await made(pool, permit)).client
                return await _here_async(pool, client, data)
            if version is None:
                version = start_waiting(pool)
                continue
            changed = await pool.pool.poll_capacity(pool.key, version, time_left(pool, end))
            version = pool.pool.version(pool.key) if changed is None else changed
    finally:
        if version is not None:
            stop_waiting(pool)


async def _here_async(pool: ClientPool[Any], client: object, data: bytes) -> bytes:
    try:
        return bytes(await call_async(pool.serving, client, data))
    finally:
        await pool.putconn_async(client)
