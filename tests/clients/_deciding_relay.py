"""A relay between one real driver connection and PostgreSQL that decides as transaction
mode's router will, and asks the server after every transaction whether it was right.

:class:`DecidingRelay` listens on a loopback port; a driver connection made to it
(psycopg with ``sslmode=disable`` and ``gssencmode=disable``, asyncpg with
``ssl=False``: the relay reads the startup's frames) reaches the server through it,
on one of ``servers`` server connections, each opened with the driver's own startup.
The transactions take the server connections in turn, as a fleet's take whichever
is free, so a statement prepared in one transaction is used on another connection
in the next. Past the startup every client message is renamed
(:class:`~orbitive.clients._statement_names.StatementNames`), handed to the server
connection's :class:`~orbitive.clients._server_statements.ServerStatements` and
noted by :class:`~orbitive.clients._client_state.ClientState`; every server message
comes back through the same two. The relay runs the checks an
:attr:`Outcome.CHECK` asks for on the same server session, answers
``Outcome.REFUSE`` with ``DISCARD ALL``, and after every transaction's end asks the
server what the session keeps (:data:`TRUTH`, its answers never reaching the
driver). :attr:`DecidingRelay.ends` lists, per ended transaction, the outcome, the
pins and the server's answer; :attr:`DecidingRelay.used`, the server connection.
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import threading
from collections import deque
from typing import Any, NamedTuple

import psycopg

from orbitive.clients import _startup, _wire
from orbitive.clients._client_state import (
    STATE_CHECK,
    TRACKED,
    ClientState,
    Outcome,
    restore_query,
    settings_check,
)
from orbitive.clients._server_statements import ServerStatements
from orbitive.clients._statement_names import StatementNames
from orbitive.clients._wire import Framer, Message

#: What the session keeps, counted by the server: advisory locks, temporary relations,
#: holdable cursors, SQL prepared statements, channels listened to, untracked settings.
TRUTH = (
    STATE_CHECK
    + b", (SELECT count(*) FROM pg_prepared_statements WHERE from_sql),"
    + b" (SELECT count(*) FROM pg_listening_channels()), ("
    + settings_check()
    + b")"
)
TRUTH_NAMES = ("advisory", "temporary", "holdable", "prepared", "listening", "settings")
#: Server message types of the startup, besides those after it.
_STARTUP_BACKEND = frozenset({ord("R"), ord("K"), ord("v")})
#: Command statuses after which the client has no prepared statement left.
_COPY = frozenset({_wire.COPY_DATA, _wire.COPY_DONE, _wire.COPY_FAIL})
_DEALLOCATING = frozenset({b"DISCARD ALL\0", b"DEALLOCATE ALL\0"})


class End(NamedTuple):
    """One ended transaction: the relay's outcome, the client's pins after it, and what
    the server said the session keeps (names of :data:`TRUTH_NAMES` with a count)."""

    outcome: Outcome
    pins: frozenset[str]
    kept: frozenset[str]


class DecidingRelay:
    """Relays one connection to the server at ``upstream`` (host, port), deciding.

    Args:
        upstream: the server's address.
        refuse: ``ClientState(refuse=...)``.
        servers: how many server connections the transactions take in turn.
        max_prepared: ``ServerStatements(max_prepared=...)`` of each.
        handover: server connections libpq opened (psycopg connections, autocommit,
            not used again until the relay ended): the relay takes their sockets
            instead of opening its own, and answers the client's startup itself
            (:mod:`orbitive.clients._startup`), as the router will.
    """

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        refuse: bool = False,
        servers: int = 1,
        max_prepared: int = 256,
        handover: list[psycopg.Connection[Any]] | None = None,
    ) -> None:
        self._handover = handover or []
        servers = len(self._handover) or servers
        self._refuse = refuse
        self.state = ClientState(refuse=refuse)  # given the startup's settings after it
        self.names = StatementNames()
        self.statements = [ServerStatements(max_prepared) for _ in range(servers)]
        self.ends: list[End] = []
        #: The server connection (its index) each ended transaction ran on.
        self.used: list[int] = []
        self.error: BaseException | None = None
        self._upstream = upstream
        self._turn = 0
        self._framers = [Framer(_wire.BACKEND | _STARTUP_BACKEND) for _ in range(servers)]
        self._pending: list[list[Message]] = [[] for _ in range(servers)]
        #: What each server connection last reported of each parameter.
        self._reported: list[dict[bytes, bytes]] = [{} for _ in range(servers)]
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def conninfo(self, user: str = "postgres", dbname: str = "postgres") -> str:
        """A libpq conninfo string that connects through the relay."""
        return (
            f"host=127.0.0.1 port={self.port} user={user} dbname={dbname}"
            " sslmode=disable gssencmode=disable"
        )

    def join(self, timeout: float = 10.0) -> None:
        """Wait for the relay to end (its client gone) and re-raise what broke it."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the relay did not end"
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        servers: list[socket.socket] = []
        try:
            client, _ = self._listener.accept()
            self._listener.close()
            with client:
                if self._handover:
                    servers += [_taken(conn) for conn in self._handover]
                    if self._answer_startup(client):
                        self._serve(client, servers)
                    return
                servers += [socket.create_connection(self._upstream) for _ in self.statements]
                self._relay(client, servers)
        except BaseException as error:  # re-raised in the test by join()
            self.error = error
        finally:
            for server in servers:
                server.close()

    def _answer_startup(self, client: socket.socket) -> bool:
        """Answer the client's startup as the router will; False when it was refused."""
        data = b""
        while True:
            packet = _startup.read_first_packet(data)
            if packet is None:
                chunk = client.recv(65536)
                if not chunk:
                    return False
                data += chunk
                continue
            first, size = packet
            data = data[size:]
            if isinstance(first, _startup.EncryptionRequest):
                client.sendall(_startup.NO_ENCRYPTION)
                continue
            if isinstance(first, _startup.Cancel):
                return False
            info = self._handover[0].info
            why = _startup.refusal(
                first,
                user=info.user,
                database=info.dbname,
                fixed={},
                tracked=TRACKED,
            )
            if why is not None:
                client.sendall(_startup.fatal("28000", why))
                return False
            for conn, reported in zip(self._handover, self._reported, strict=True):
                for name in _startup.REPORTED:
                    if (value := conn.pgconn.parameter_status(name)) is not None:
                        reported[name] = value
            reported = self._reported[0]
            self.state = ClientState(refuse=self._refuse, reported=reported)
            client.sendall(_startup.startup_answer(reported, _startup.Cancel(os.getpid(), 7)))
            return True

    def _relay(self, client: socket.socket, servers: list[socket.socket]) -> None:
        (length,) = struct.unpack("!I", client.recv(4, socket.MSG_WAITALL))
        startup = struct.pack("!I", length) + client.recv(length - 4, socket.MSG_WAITALL)
        for turn, server in enumerate(servers):
            self._turn = turn
            server.sendall(startup)
            while True:  # each server's startup; the first one's is the client's
                message = self._server_message(server)
                if turn == 0:
                    client.sendall(message.frame())
                if message.kind == _wire.READY_FOR_QUERY:
                    break
        self._turn = 0
        self.state = ClientState(refuse=self._refuse, reported=self._reported[0])
        self._serve(client, servers)

    def _serve(self, client: socket.socket, servers: list[socket.socket]) -> None:
        """Pass messages both ways. After a ``Sync`` or ``Query`` no client message
        but the data of a ``COPY`` goes on until its ``ReadyForQuery`` came back (a
        pipeline is served one ``Sync`` at a time), so a transaction's end is
        decided, and the next server connection taken, with no message in flight."""
        client_framer = Framer(_wire.FRONTEND)
        queued: deque[Message] = deque()
        awaiting = False
        while True:
            while queued and (not awaiting or queued[0].kind in _COPY):
                message = queued.popleft()
                if message.kind == _wire.TERMINATE:
                    return
                if not self.state.bound:  # a transaction starts: the client's settings first
                    self._restore_settings(servers[self._turn])
                op = self.names.op(message)
                self.state.from_client(op.message)
                to_server, now = self.statements[self._turn].send(op)
                servers[self._turn].sendall(b"".join(m.frame() for m in to_server))
                client.sendall(b"".join(m.frame() for m in now))
                awaiting = awaiting or message.kind in (_wire.SYNC, _wire.QUERY)
            server = servers[self._turn]
            readable = [server] if self._pending[self._turn] else []
            if not readable:
                readable = _readable(client, server)
            if server in readable:
                statements = self.statements[self._turn]
                for answer in statements.answer(self._server_message(server)):
                    if self._pass_on(client, server, answer):
                        awaiting = False
            if client in readable:
                data = client.recv(65536)
                if not data:
                    return
                queued += client_framer.feed(data)

    def _pass_on(self, client: socket.socket, server: socket.socket, message: Message) -> bool:
        """Pass one answer on through the client's state; True after a ``ReadyForQuery``."""
        if message.kind == _wire.COMMAND_COMPLETE and message.body in _DEALLOCATING:
            self.names.forget_all()
        outcome, out = self.state.from_server(message)
        client.sendall(b"".join(m.frame() for m in out))
        if outcome is Outcome.CONTINUE:
            return bool(out) and out[-1].kind == _wire.READY_FOR_QUERY
        if outcome is Outcome.CHECK:
            checks = self.state.checks
            state = checks.STATE in checks and self._count(server, STATE_CHECK) > 0
            settings = checks.SETTINGS in checks and self._count(server, settings_check()) > 0
            outcome = self.state.checked(state=state, settings=settings)
        elif outcome is Outcome.REFUSE:
            self._swallow(server, b"DISCARD ALL")
            self.statements[self._turn].forget_all()
        counts = zip(TRUTH_NAMES, self._row(server, TRUTH), strict=True)
        self.ends.append(
            End(outcome, self.state.pins, frozenset(n for n, c in counts if c != b"0"))
        )
        self.used.append(self._turn)
        if outcome is not Outcome.PINNED:
            self._turn = (self._turn + 1) % len(self.statements)
        return True

    def _count(self, server: socket.socket, text: bytes) -> int:
        return sum(int(value or b"0") for value in self._row(server, text))

    def _row(self, server: socket.socket, text: bytes) -> list[bytes | None]:
        rows = [m for m in self._swallow(server, text) if m.kind == _wire.DATA_ROW]
        assert len(rows) == 1, f"{text!r} returned {len(rows)} rows"
        return _wire.data_row(rows[0].body)

    def _swallow(self, server: socket.socket, text: bytes) -> list[Message]:
        """Run ``text`` on the server session; its answers, up to ``ReadyForQuery``."""
        server.sendall(_wire.query(text).frame())
        self.statements[self._turn].ran_query()
        answers = []
        while True:
            message = self._server_message(server)
            answers.append(message)
            if message.kind == _wire.ERROR_RESPONSE:
                raise AssertionError(f"{text!r} failed: {_wire.error_fields(message.body)}")
            if message.kind == _wire.READY_FOR_QUERY:
                return answers

    def _server_message(self, server: socket.socket) -> Message:
        pending = self._pending[self._turn]
        while not pending:
            data = server.recv(65536)
            if not data:
                self._framers[self._turn].end()
                raise EOFError("the server closed the session")
            pending += self._framers[self._turn].feed(data)
        message = pending.pop(0)
        if message.kind == _wire.PARAMETER_STATUS:
            name, value = _wire.parameter_status(message.body)
            self._reported[self._turn][name] = value
        return message

    def _restore_settings(self, server: socket.socket) -> None:
        query = restore_query(self.state.settings, self._reported[self._turn])
        if query is not None:
            self._swallow(server, query)


def _readable(*socks: socket.socket) -> list[socket.socket]:
    """Which of ``socks`` have bytes to read, once one has (``selectors``: a test
    process may hold descriptors past 1024, which ``select.select`` cannot watch)."""
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        return [key.fileobj for key, _ in selector.select()]  # type: ignore[misc]


def _taken(conn: psycopg.Connection[Any]) -> socket.socket:
    """The socket of a libpq connection, for the relay to read and write from now on.

    It shares libpq's non-blocking mode (one open file); a timeout makes Python wait
    for each read and write in ``poll`` and keeps the mode as it is."""
    taken = socket.socket(fileno=os.dup(conn.pgconn.socket))
    taken.settimeout(30.0)
    return taken
