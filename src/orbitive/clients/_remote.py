"""Remote mode: a request may run on another process's idle client, over a session.

For request/response protocols (an HTTP/1 connection, a Redis connection) a
request need not run on a client of its own process. ``pool.request(payload)``
runs ``handler(client, payload) -> bytes`` on, in this order: an idle client
of this process; another process's idle client, by reserving its unit and
carrying the lease and the payload to the owner over a Unix socket; a new
client within ``max_live``; or it waits. That order is the checkout's plan
with a borrow in it (:meth:`~._checkout.Checkout.run` with ``borrow``). The
owner accepts the lease (:func:`~orbitive.pool.session.accept_session`), runs
the handler on its own client, replies and completes the unit: the client
stays where it is, and the user writes no framing, socket paths or lease
handling.

After the 48-byte lease frame the borrower sends ``u32 length, payload``; the
owner answers ``u8 status, u32 length, body``: status 0 is the reply, 1 the
handler's error text (:class:`~orbitive.clients.RemoteRequestError`), 2 the
lease refused (the borrower tries another way). Each owner listens on
``/dev/shm/orbit-{fleet}-{kind}-clients-{node}-{key prefix}-{uid}.sock``.

Every exit returns what it took exactly once: a reservation the borrower could
not deliver (a dead socket, a cancelled or interrupted borrower) is withdrawn,
which the table refuses harmlessly once the owner accepted it; a handler
interrupted by a ``BaseException`` leaves its client in an unknown state, so
the client is closed, on either side.

:class:`Remote` reaches the pool only through the parts it is given: the
checkout (plan, return), the key's ledger (lend, lent back), the closing, the
table handle and the counters.
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
from collections.abc import Callable
from typing import Any, Final, Generic, TypeVar, final

from .._core._access import euid
from .._core._bytes import exact_bytes
from .._core._errors import (
    AccessDenied,
    BusyError,
    DrainingError,
    FleetError,
    InvalidPoolOptions,
    MalformedError,
    OrbitError,
    RemoteRequestError,
    SessionClosed,
    StaleError,
    shown,
)
from .._core._region import SHM_DIR, client_socket_name
from ..pool import Key, Lease, Pool, ResourceId
from ..pool.session import accept_session, accept_session_async, open_session, open_session_async
from ._callbacks import call_async, call_sync, started
from ._checkout import Checkout
from ._ledger import Entry, Family, Ledger
from ._retiring import Retiring
from ._statistics import Counters

C = TypeVar("C")

LENGTH: Final = struct.Struct("<I")
REPLY: Final = struct.Struct("<BI")
OK: Final = 0
FAILED: Final = 1
REFUSED: Final = 2
#: Largest request or reply, in bytes.
MESSAGE_MAX: Final = 64 << 20
#: Seconds a borrower waits for an owner's reply at most.
REPLY_TIMEOUT_S: Final = 30.0


def socket_path(fleet: str, kind: int, key: Key, node: int) -> str:
    """Where the owner on ``node`` serves remote requests for ``key``.

    In ``/dev/shm`` beside the fleet's objects, named by user id, so every member
    finds it whatever its environment; the sticky folder keeps other users from
    removing it, and :func:`ours` refuses one another user planted.
    """
    return str(SHM_DIR / client_socket_name(fleet, kind, node, str(key)[:12]))


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


def _failed(error: Exception) -> bytes:
    return _answer(FAILED, repr(error).encode()[:4096])


def _reply(status: int, body: bytes) -> bytes | None:
    """The borrower's reading of an answer: the reply, None (refused), or the error."""
    if status == OK:
        return body
    if status == REFUSED:
        return None
    raise RemoteRequestError(f"the owner's handler failed: {body.decode(errors='replace')}")


@final
class Remote(Generic[C]):
    """Remote mode of one ClientPool in this process: its requests, and the owner's
    server for other processes' requests on its idle clients.

    Args:
        fleet: the fleet's name (the socket paths' part).
        handle: the pool's table handle (reservations, candidates, sessions).
        key: the pool's key.
        handler: ``handler(client, request: bytes) -> bytes``, or a coroutine function.
        checkout: the pool's checkout and return.
        ledger: the key's clients in this process.
        family: the pool's family in the ledger (the clients it serves others on).
        retiring: the pool's closing.
        counters: the pool's counters.

    Raises:
        AccessDenied: the socket path is taken by something that is not ours.
        OSError: the socket cannot be bound.
    """

    def __init__(
        self,
        fleet: str,
        handle: Pool,
        key: Key,
        handler: Callable[[C, bytes], Any],
        checkout: Checkout[C],
        ledger: Ledger[C],
        family: Family[C],
        retiring: Retiring,
        counters: Counters,
    ) -> None:
        self._fleet, self._handle, self._key, self._handler = fleet, handle, key, handler
        self._checkout, self._ledger, self._retiring = checkout, ledger, retiring
        self._counters = counters
        path = socket_path(fleet, handle.kind, key, handle.node)
        self.server: Server | AsyncServer = (
            AsyncServer if inspect.iscoroutinefunction(handler) else Server
        )(path, handle, ledger, family, retiring, handler)

    def close(self) -> None:
        """Stop serving other processes and remove the socket."""
        self.server.close()

    # -- a request, end to end ----------------------------------------------------------

    def request(self, data: bytes, timeout: float | None) -> bytes:
        """``ClientPool.request``: ours, theirs, a new one, or wait (see the module)."""
        got = self._checkout.run(timeout, lambda: self.borrow(data))
        return got if isinstance(got, bytes) else self._here(got, data)

    async def request_async(self, data: bytes, timeout: float | None) -> bytes:
        """Asyncio twin of :meth:`request`."""
        await self.serve_async()
        got = await self._checkout.run_async(timeout, lambda: self.borrow_async(data))
        return got if isinstance(got, bytes) else await self._here_async(got, data)

    def _here(self, entry: Entry[C], data: bytes) -> bytes:
        """Run the handler on a client of ours, then take the client back."""
        try:
            reply = bytes(call_sync("handler", self._handler, entry.client, data))
        except Exception:
            self._checkout.put(self._ledger.recall(entry))
            raise
        except BaseException:  # interrupted mid-request: the client's state is unknown
            self._retiring.hand_over(self._ledger.recall(entry))
            raise
        self._checkout.put(self._ledger.recall(entry))
        return reply

    async def _here_async(self, entry: Entry[C], data: bytes) -> bytes:
        """Asyncio twin of :meth:`_here`; a caller cancelled or interrupted meanwhile
        leaves the handler running, and its client is closed once it ends (never reused
        mid-protocol)."""
        running = started(self._handler, entry.client, data)
        try:
            reply = bytes(await self._checkout.outlasting(entry, running, _never))
        except Exception:
            await self._checkout.put_async(self._ledger.recall(entry))
            raise
        await self._checkout.put_async(self._ledger.recall(entry))
        return reply

    async def serve_async(self) -> None:
        """Start the owner's asyncio server on this loop (a coroutine handler; once)."""
        if isinstance(self.server, AsyncServer):
            await self.server.start()

    # -- the borrower --------------------------------------------------------------------

    def _reserve(self) -> Lease | None:
        """Reserve one unit of another process's idle client, or None."""
        for candidate in self._handle.candidates(self._key):
            if candidate.local or candidate.state != "live" or candidate.free <= 0:
                continue
            try:
                return self._handle.reserve(candidate.id)
            except (BusyError, StaleError, DrainingError):
                continue
        return None

    def _withdraw(self, lease: Lease) -> None:
        """Take back a reservation that may not have reached its owner; the table refuses
        it harmlessly once the owner accepted it (the owner then completes the unit)."""
        with contextlib.suppress(OrbitError):
            self._handle.cancel_reservation(lease)

    def borrow(self, data: bytes) -> bytes | None:
        """Run ``data`` on another process's idle client; None when none could serve it.

        Raises:
            RemoteRequestError: the owner's handler raised.
        """
        lease = self._reserve()
        if lease is None:
            return None
        path = socket_path(self._fleet, self._handle.kind, self._key, lease.id.node)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(REPLY_TIMEOUT_S)
                if not ours(path):
                    raise ConnectionRefusedError(path)
                sock.connect(path)
                open_session(lease, sock, LENGTH.pack(len(data)) + data)
                status, size = REPLY.unpack(_recv_exactly(sock, REPLY.size))
                body = _recv_exactly(sock, size)
        except BaseException as error:
            self._withdraw(lease)
            if isinstance(error, (OSError, SessionClosed)):
                return None  # the owner died or went away: another way
            raise
        self._counters.borrowed += 1
        return _reply(status, body)

    async def borrow_async(self, data: bytes) -> bytes | None:
        """Asyncio twin of :meth:`borrow`.

        Raises:
            RemoteRequestError: the owner's handler raised.
        """
        lease = self._reserve()
        if lease is None:
            return None
        path = socket_path(self._fleet, self._handle.kind, self._key, lease.id.node)
        try:
            if not ours(path):
                raise ConnectionRefusedError(path)
            reader, writer = await asyncio.open_unix_connection(path)
            try:
                await open_session_async(lease, writer, LENGTH.pack(len(data)) + data)
                status, body = await asyncio.wait_for(_read_answer(reader), REPLY_TIMEOUT_S)
            finally:
                writer.close()
        except BaseException as error:
            self._withdraw(lease)
            if isinstance(error, (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError)):
                return None
            raise
        self._counters.borrowed += 1
        return _reply(status, body)


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status, size = REPLY.unpack(await reader.readexactly(REPLY.size))
    return status, await reader.readexactly(size)


def _never(outcome: Any) -> bool:
    """A request whose caller gave up never hands its client back for reuse."""
    del outcome
    return False


# -- the owner ---------------------------------------------------------------------------


class Server:
    """The owner's side: a Unix socket, one thread per borrower connection."""

    def __init__(
        self,
        path: str,
        handle: Pool,
        ledger: Ledger[Any],
        family: Family[Any],
        retiring: Retiring,
        handler: Callable[[Any, bytes], Any],
    ) -> None:
        self.path, self._handle, self._ledger, self._family = path, handle, ledger, family
        self._retiring, self._handler = retiring, handler
        if os.path.lexists(path):
            if not ours(path):
                raise AccessDenied(f"{path!r} is not a socket of ours; refusing it")
            os.unlink(path)  # a dead predecessor's socket: this node is ours now
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        os.chmod(path, 0o600)
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
        # FleetError: the fleet was closed while the request ran (close() does not wait
        # for one): its table, and so the unit to complete, are gone with it.
        with conn, contextlib.suppress(OSError, SessionClosed, MalformedError, FleetError):
            try:
                execution = accept_session(self._handle, conn)
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
        entry = self._ledger.lend(rid, self._family)
        if entry is None:
            return _answer(REFUSED, b"")
        try:
            answer = _answer(OK, bytes(call_sync("handler", self._handler, entry.client, request)))
        except Exception as error:  # the borrower gets the error's text
            answer = _failed(error)
        except BaseException:  # interrupted mid-request: the client's state is unknown
            self._retiring.hand_over(entry)
            raise
        if not self._ledger.lent_back(entry):
            self._retiring.retire(entry)
        return answer

    def close(self) -> None:
        """Stop listening and remove the socket."""
        self.listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


class AsyncServer:
    """The owner's side for a coroutine handler: an asyncio Unix server on the pool's loop."""

    def __init__(
        self,
        path: str,
        handle: Pool,
        ledger: Ledger[Any],
        family: Family[Any],
        retiring: Retiring,
        handler: Callable[[Any, bytes], Any],
    ) -> None:
        self.path, self._handle, self._ledger, self._family = path, handle, ledger, family
        self._retiring, self._handler = retiring, handler
        self.server: asyncio.AbstractServer | None = None
        self._starting = False

    async def start(self) -> None:
        """Listen on this loop, once (a start interrupted part way is tried again)."""
        if self.server is not None or self._starting:
            return
        self._starting = True
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self.server = await asyncio.start_unix_server(self._serve, self.path)
        finally:
            self._starting = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                execution = await accept_session_async(self._handle, reader)
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
        except (OSError, asyncio.IncompleteReadError, FleetError):  # FleetError: as Server's
            return
        finally:
            writer.close()

    async def _run(self, rid: ResourceId, request: bytes) -> bytes:
        entry = self._ledger.lend(rid, self._family)
        if entry is None:
            return _answer(REFUSED, b"")
        try:
            answer = _answer(OK, bytes(await call_async(self._handler, entry.client, request)))
        except Exception as error:
            answer = _failed(error)
        except BaseException:  # interrupted (the loop ending): the client's state is unknown
            self._retiring.hand_over(entry)
            raise
        if not self._ledger.lent_back(entry):
            await self._retiring.retire_async(entry)
        return answer

    def close(self) -> None:
        """Stop listening and remove the socket."""
        if self.server is not None:
            self.server.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
