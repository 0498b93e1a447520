"""Transaction mode's router, in Python: the reference the C router will be measured by.

One thread serves every client connection of the router's process on a Unix socket
(``{folder}/.s.PGSQL.{port}``, where libpq and asyncpg look for one) and runs each
client's transactions on the server connections it was handed: an idle one, else
the client waits, first come first served, for the next one a transaction gives
back (docs/architecture.md, "Transaction mode: the plan"). It answers each driver's
startup itself (:mod:`._startup`), renames statements and writes the answers it
owes (:mod:`._statement_names`, :mod:`._server_statements`), decides where a
transaction ends and what pins (:mod:`._client_state`), gives each client its
tracked settings on every connection, and runs the checks, refusals and clean-ups
on the server connection itself, their answers swallowed.

A client's messages go on one ``Sync`` (or ``Query``) at a time: the next waits for
the ``ReadyForQuery`` of the last, so a transaction's end is decided with nothing
of the client's in flight. A client that leaves inside a transaction takes its
server connection with it (closed: the server rolls back); one that leaves pinned
has it cleaned (``DISCARD ALL``) before anyone else gets it.

This is the reference, not the fast path: the thread takes the GIL for every
message. Loans to other processes, cancel requests and the pool's accounting of
the server connections are not here yet.
"""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import selectors
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any, Final, final

from .._core._errors import MalformedError
from . import _startup, _wire
from ._client_state import (
    STATE_CHECK,
    TRACKED,
    Checks,
    ClientState,
    Outcome,
    restore_query,
    settings_check,
)
from ._server_statements import ServerStatements
from ._startup import Cancel
from ._statement_names import StatementNames
from ._wire import Framer, Message

#: Seconds a write to a client or server may wait for room in its socket.
WRITE_TIMEOUT_S: Final = 10.0
_COPY: Final = frozenset({_wire.COPY_DATA, _wire.COPY_DONE, _wire.COPY_FAIL})
#: Client messages whose answers end with a ``ReadyForQuery``.
_ANSWERED_BY_READY: Final = frozenset({_wire.SYNC, _wire.QUERY, _wire.FUNCTION_CALL})
_DEALLOCATING: Final = frozenset({b"DISCARD ALL\0", b"DEALLOCATE ALL\0"})
_READ_SIZE: Final = 65536


class _Server:
    """One server connection: the libpq connection that opened it (kept, never used
    while the router runs), its socket, and what the router knows of its session."""

    def __init__(self, conn: Any, max_prepared: int) -> None:
        self.conn = conn
        self.sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
        self.sock.settimeout(WRITE_TIMEOUT_S)  # non-blocking underneath, as libpq left it
        self.framer = Framer(_wire.BACKEND)
        self.statements = ServerStatements(max_prepared)
        self.reported = {
            name: value
            for name in _startup.REPORTED
            if (value := conn.pgconn.parameter_status(name)) is not None
        }
        self.client: _Client | None = None
        #: The router's own statement running, and what to do with its answers.
        self.internal: list[Message] | None = None
        self.then: Callable[[list[Message]], None] | None = None

    def send(self, messages: Sequence[Message]) -> bool:
        """Write ``messages``; False when the connection broke."""
        return _send(self.sock, messages)


class _Client:
    """One driver connection: its startup bytes, then its messages and state."""

    def __init__(self, sock: socket.socket, refuse: bool) -> None:
        self.sock = sock
        self.sock.settimeout(WRITE_TIMEOUT_S)
        self.first = b""  # the startup packet, until it is whole
        self.framer: Framer | None = None
        self.refuse = refuse
        self.state = ClientState(refuse=refuse)
        self.names = StatementNames()
        self.queued: collections.deque[Message] = collections.deque()
        self.server: _Server | None = None
        self.secret = -1  # of its BackendKeyData, once started
        self.awaiting = False  # a Sync or Query went on; its ReadyForQuery has not come
        self.in_block = False  # the last ReadyForQuery said T or E

    def send(self, messages: Sequence[Message]) -> bool:
        """Write ``messages``; False when the connection broke."""
        return _send(self.sock, messages)


def _send(sock: socket.socket, messages: Sequence[Message]) -> bool:
    if messages:
        try:
            sock.sendall(b"".join(message.frame() for message in messages))
        except OSError:
            return False
    return True


@final
class Router:
    """Serves drivers' connections on the server connections it is handed.

    Args:
        folder: the directory of the listening socket (created 0700 if missing).
        port: the number in the socket's name, ``.s.PGSQL.{port}`` (what a driver
            is given as its port).
        connections: psycopg connections in autocommit mode, idle, of one role and
            database: the router takes their sockets; nothing else may use them
            until :meth:`close`.
        refuse: ``on_session_state="refuse"``.
        max_prepared: statements kept prepared per server connection.

    Raises:
        ValueError: no connections.
    """

    def __init__(
        self,
        folder: str,
        port: int,
        connections: Sequence[Any],
        *,
        refuse: bool = False,
        max_prepared: int = 256,
    ) -> None:
        if not connections:
            raise ValueError("a router needs at least one server connection")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self.path = os.path.join(folder, f".s.PGSQL.{port}")
        self._user = connections[0].info.user
        self._database = connections[0].info.dbname
        self._refuse = refuse
        self._servers = [_Server(conn, max_prepared) for conn in connections]
        self._idle = collections.deque(self._servers)
        self._waiting: collections.deque[_Client] = collections.deque()
        self._selector = selectors.DefaultSelector()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Bound under another name and renamed once listening, so that a driver
        # never finds the socket refusing connections.
        binding = f"{self.path}.{os.getpid()}.new"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(binding)
        self._listener.bind(binding)
        os.chmod(binding, 0o600)
        self._listener.listen(128)
        os.replace(binding, self.path)
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._listener, selectors.EVENT_READ, self._accept)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        for server in self._servers:
            self._selector.register(server.sock, selectors.EVENT_READ, server)
        #: Clients by the secret key of their ``BackendKeyData``, for cancel requests.
        self._by_secret: dict[int, _Client] = {}
        self._thread = threading.Thread(target=self._run, name="orbitive-router", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving: every client connection is closed, the server connections are
        left to their libpq connections (idle ones usable again; one a client left in
        a transaction closed)."""
        self._wake_w.send(b"x")
        self._thread.join()
        self._wake_w.close()

    @property
    def server_connections(self) -> int:
        """How many server connections the router still has."""
        return len(self._servers)

    @property
    def waiting(self) -> int:
        """How many clients wait for a server connection, now."""
        return len(self._waiting)

    def _run(self) -> None:
        try:
            while True:
                for key, _ in self._selector.select():
                    if key.data is None:
                        return
                    if isinstance(key.data, _Server):
                        self._server_readable(key.data)
                    elif isinstance(key.data, _Client):
                        self._client_readable(key.data)
                    else:
                        key.data()
        finally:
            for server in list(self._servers):
                if server.client is not None or server.internal is not None:
                    self._server_gone(server)  # its session is a client's: not libpq's again
            for key in list(self._selector.get_map().values()):
                if isinstance(key.data, _Client):
                    self._client_gone(key.data)
            for server in self._servers:
                server.sock.close()
            self._listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            self._wake_r.close()
            self._selector.close()

    def _accept(self) -> None:
        sock, _ = self._listener.accept()
        client = _Client(sock, self._refuse)
        self._selector.register(sock, selectors.EVENT_READ, client)

    def _client_readable(self, client: _Client) -> None:
        try:
            data = client.sock.recv(_READ_SIZE)
            if not data:
                raise EOFError
            if client.framer is None:
                self._startup(client, data)
            else:
                client.queued += client.framer.feed(data)
        except (OSError, EOFError, MalformedError):
            self._client_gone(client)
            return
        self._pump(client)

    def _startup(self, client: _Client, data: bytes) -> None:
        client.first += data
        while client.framer is None and (packet := _startup.read_first_packet(client.first)):
            first, size = packet
            client.first = client.first[size:]
            if isinstance(first, _startup.EncryptionRequest):
                client.sock.sendall(_startup.NO_ENCRYPTION)
                continue
            if isinstance(first, _startup.Cancel):
                self._cancel(first)
                raise EOFError  # a cancel request gets no answer: the connection closes
            why = _startup.refusal(
                first, user=self._user, database=self._database, fixed={}, tracked=TRACKED
            )
            if why is not None:
                client.sock.sendall(_startup.fatal("28000", why))
                raise EOFError
            reported = self._servers[0].reported
            client.state = ClientState(refuse=client.refuse, reported=reported)
            client.secret = secrets.randbits(31)
            while client.secret in self._by_secret:
                client.secret = secrets.randbits(31)
            self._by_secret[client.secret] = client
            cancel = _startup.Cancel(os.getpid(), client.secret)
            client.sock.sendall(_startup.startup_answer(reported, cancel))
            client.framer = Framer(_wire.FRONTEND)
            client.queued += client.framer.feed(client.first)

    def _cancel(self, request: Cancel) -> None:
        """Cancel what the named client runs, where it runs: libpq's cancel request on
        the server connection serving it, sent from a thread of its own (it connects
        to the server; psycopg's ``cancel_safe`` waits without the GIL). A key that
        names no client, or one not running anything, is ignored, as the server
        ignores it.

        A driver in the router's own process must cancel with ``cancel_safe()``:
        psycopg's ``cancel()`` (libpq's ``PQcancel``) holds the GIL while it waits for
        the router's answer, which this router, in Python, cannot then give."""
        client = self._by_secret.get(request.secret)
        if request.process != os.getpid() or client is None or client.server is None:
            return
        conn = client.server.conn
        threading.Thread(target=_cancel_quietly, args=(conn,), daemon=True).start()

    def _pump(self, client: _Client) -> None:
        """Pass on what the client sent, as far as its turn and its last ``Sync`` allow."""
        while client.queued and client.framer is not None:
            message = client.queued[0]
            if message.kind == _wire.TERMINATE:
                self._client_gone(client)
                return
            if client.awaiting and message.kind not in _COPY:
                return
            server = client.server or self._take(client)
            if server is None or server.internal is not None:
                return
            client.queued.popleft()
            try:
                op = client.names.op(message)
                client.state.from_client(op.message)
            except MalformedError:
                self._client_gone(client)
                return
            to_server, now = server.statements.send(op)
            client.awaiting = client.awaiting or message.kind in _ANSWERED_BY_READY
            if not server.send(to_server):
                self._server_gone(server)
                return
            if not client.send(now):
                self._client_gone(client)
                return

    def _take(self, client: _Client) -> _Server | None:
        """A server connection for the client's next transaction, with its settings;
        None while it waits its turn."""
        if not self._idle or (self._waiting and self._waiting[0] is not client):
            if client not in self._waiting:
                self._waiting.append(client)
            return None
        if self._waiting:
            self._waiting.popleft()
        server = self._idle.popleft()
        server.client, client.server = client, server
        query = restore_query(client.state.settings, server.reported)
        if query is not None:
            self._internal(server, query, lambda _: self._pump(client))
        return server

    def _give_back(self, server: _Server) -> None:
        if server.client is not None:
            server.client.server = None
        server.client = None
        self._idle.append(server)
        if self._waiting:
            self._pump(self._waiting[0])

    def _internal(
        self, server: _Server, text: bytes, then: Callable[[list[Message]], None]
    ) -> None:
        """Run the router's own statement on the server; ``then`` gets its answers."""
        server.internal, server.then = [], then
        server.statements.ran_query()
        if not server.send([_wire.query(text)]):
            self._server_gone(server)

    def _server_readable(self, server: _Server) -> None:
        try:
            data = server.sock.recv(_READ_SIZE)
            if not data:
                raise EOFError
            messages = server.framer.feed(data)
        except (OSError, EOFError, MalformedError):
            self._server_gone(server)
            return
        for message in messages:
            if server not in self._servers:
                return
            try:
                self._server_message(server, message)
            except MalformedError:
                self._server_gone(server)

    def _server_message(self, server: _Server, message: Message) -> None:
        if message.kind == _wire.PARAMETER_STATUS:
            name, value = _wire.parameter_status(message.body)
            server.reported[name] = value
        if server.internal is not None:
            server.internal.append(message)
            if message.kind == _wire.READY_FOR_QUERY:
                answers, then = server.internal, server.then
                server.internal = server.then = None
                assert then is not None
                then(answers)
            return
        client = server.client
        if client is None:
            return  # a notice or a report between transactions
        for answer in server.statements.answer(message):
            if answer.kind == _wire.COMMAND_COMPLETE and answer.body in _DEALLOCATING:
                client.names.forget_all()
            outcome, out = client.state.from_server(answer)
            if not client.send(out):
                self._client_gone(client)
                return
            if answer.kind == _wire.READY_FOR_QUERY:
                client.awaiting = False
                client.in_block = answer.body != b"I"
            self._after(server, client, outcome)
        if server.client is client and server.internal is None:
            self._pump(client)

    def _after(self, server: _Server, client: _Client, outcome: Outcome) -> None:
        if outcome is Outcome.RELEASE:
            self._give_back(server)
        elif outcome is Outcome.REFUSE:
            server.statements.forget_all()
            self._internal(server, b"DISCARD ALL", lambda _: self._give_back(server))
        elif outcome is Outcome.CHECK:
            checks = client.state.checks
            text = b"; ".join(
                query
                for wanted, query in (
                    (Checks.STATE, STATE_CHECK),
                    (Checks.SETTINGS, settings_check()),
                )
                if wanted in checks
            )

            def decide(answers: list[Message]) -> None:
                rows = iter(_counts(answers))
                state = Checks.STATE in checks and next(rows) > 0
                settings = Checks.SETTINGS in checks and next(rows) > 0
                if client.state.checked(state=state, settings=settings) is Outcome.RELEASE:
                    self._give_back(server)
                else:
                    self._pump(client)

            self._internal(server, text, decide)

    def _client_gone(self, client: _Client) -> None:
        if client.framer is None and client.sock.fileno() < 0:
            return  # gone already
        client.framer = None
        if self._by_secret.get(client.secret) is client:
            del self._by_secret[client.secret]
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(client.sock)
        client.sock.close()
        if client in self._waiting:
            self._waiting.remove(client)
        server = client.server
        if server is None:
            return
        if client.awaiting or client.in_block or server.internal is not None:
            self._server_gone(server)  # inside a transaction: closing it rolls it back
        elif client.state.pins:
            server.statements.forget_all()
            self._internal(server, b"DISCARD ALL", lambda _: self._give_back(server))
        else:
            self._give_back(server)

    def _server_gone(self, server: _Server) -> None:
        if server not in self._servers:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(server.sock)
        server.sock.close()
        with contextlib.suppress(Exception):
            server.conn.close()
        if server in self._idle:
            self._idle.remove(server)
        self._servers.remove(server)
        client, server.client = server.client, None
        if client is not None:
            client.server = None
            with contextlib.suppress(OSError):
                client.sock.sendall(
                    _startup.fatal("08006", "the server connection serving this client was lost")
                )
            self._client_gone(client)


def _cancel_quietly(conn: Any) -> None:
    with contextlib.suppress(Exception):
        conn.cancel_safe(timeout=WRITE_TIMEOUT_S)


def _counts(answers: list[Message]) -> list[int]:
    """The sum of each result row's counts, in order, of the router's own checks."""
    return [
        sum(int(value or b"0") for value in _wire.data_row(message.body))
        for message in answers
        if message.kind == _wire.DATA_ROW
    ]
