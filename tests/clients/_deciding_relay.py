"""A relay between one real driver connection and PostgreSQL that decides as transaction
mode's router will, and asks the server after every transaction whether it was right.

:class:`DecidingRelay` listens on a loopback port; a psycopg connection made to it
(``sslmode=disable``, ``gssencmode=disable``: the relay reads the startup's frames)
reaches the server through it. Past the startup every message goes through
:class:`~orbitive.clients._client_state.ClientState`: the relay passes on what it
returns, runs the checks an :attr:`Outcome.CHECK` asks for on the same server
session, answers ``Outcome.REFUSE`` with ``DISCARD ALL``, and after every
transaction's end asks the server what the session keeps (:data:`TRUTH`, its
answers never reaching the driver). :attr:`DecidingRelay.ends` lists, per ended
transaction, the outcome, the pins and the server's answer.
"""

from __future__ import annotations

import socket
import struct
import threading
from typing import NamedTuple

from orbitive.clients import _wire
from orbitive.clients._client_state import (
    STATE_CHECK,
    ClientState,
    Outcome,
    settings_check,
)
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


class End(NamedTuple):
    """One ended transaction: the relay's outcome, the client's pins after it, and what
    the server said the session keeps (names of :data:`TRUTH_NAMES` with a count)."""

    outcome: Outcome
    pins: frozenset[str]
    kept: frozenset[str]


def data_row(body: bytes) -> list[bytes | None]:
    """The text values of a ``DataRow`` (``None`` for NULL)."""
    (count,) = struct.unpack_from("!H", body)
    values: list[bytes | None] = []
    offset = 2
    for _ in range(count):
        (size,) = struct.unpack_from("!i", body, offset)
        offset += 4
        values.append(None if size < 0 else body[offset : offset + size])
        offset += max(size, 0)
    return values


class DecidingRelay:
    """Relays one connection to the server at ``upstream`` (host, port), deciding.

    Args:
        upstream: the server's address.
        refuse: ``ClientState(refuse=...)``.
    """

    def __init__(self, upstream: tuple[str, int], *, refuse: bool = False) -> None:
        self.state = ClientState(refuse=refuse)
        self.ends: list[End] = []
        self.error: BaseException | None = None
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._server_framer = Framer(_wire.BACKEND | _STARTUP_BACKEND)
        self._pending: list[Message] = []
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
        try:
            client, _ = self._listener.accept()
            self._listener.close()
            with client, socket.create_connection(self._upstream) as server:
                self._relay(client, server)
        except BaseException as error:  # re-raised in the test by join()
            self.error = error

    def _relay(self, client: socket.socket, server: socket.socket) -> None:
        (length,) = struct.unpack("!I", _recv_exactly(client, 4))
        server.sendall(struct.pack("!I", length) + _recv_exactly(client, length - 4))
        while True:  # the startup: passed on until the server is ready
            message = self._server_message(server)
            client.sendall(message.frame())
            if message.kind == _wire.READY_FOR_QUERY:
                break
        client_framer = Framer(_wire.FRONTEND)
        while True:
            data = client.recv(65536)
            if not data:
                return
            for message in client_framer.feed(data):
                if message.kind == _wire.TERMINATE:
                    server.sendall(message.frame())
                    return
                self.state.from_client(message)
                server.sendall(message.frame())
                if message.kind in (_wire.SYNC, _wire.QUERY):
                    self._answers(client, server)

    def _answers(self, client: socket.socket, server: socket.socket) -> None:
        """Relay the server's answers up to its ``ReadyForQuery``, then end or go on."""
        while True:
            outcome, out = self.state.from_server(self._server_message(server))
            client.sendall(b"".join(message.frame() for message in out))
            if outcome is Outcome.CONTINUE:
                if out and out[-1].kind == _wire.READY_FOR_QUERY:
                    return
                continue
            if outcome is Outcome.CHECK:
                checks = self.state.checks
                state = checks.STATE in checks and self._count(server, STATE_CHECK) > 0
                settings = checks.SETTINGS in checks and self._count(server, settings_check()) > 0
                outcome = self.state.checked(state=state, settings=settings)
            elif outcome is Outcome.REFUSE:
                self._swallow(server, b"DISCARD ALL")
            truth = self._row(server, TRUTH)
            kept = frozenset(
                name for name, count in zip(TRUTH_NAMES, truth, strict=True) if count != b"0"
            )
            self.ends.append(End(outcome, self.state.pins, kept))
            return

    def _count(self, server: socket.socket, text: bytes) -> int:
        return sum(int(value or b"0") for value in self._row(server, text))

    def _row(self, server: socket.socket, text: bytes) -> list[bytes | None]:
        rows = [m for m in self._swallow(server, text) if m.kind == _wire.DATA_ROW]
        assert len(rows) == 1, f"{text!r} returned {len(rows)} rows"
        return data_row(rows[0].body)

    def _swallow(self, server: socket.socket, text: bytes) -> list[Message]:
        """Run ``text`` on the server session; its answers, up to ``ReadyForQuery``."""
        server.sendall(_wire.query(text).frame())
        answers = []
        while True:
            message = self._server_message(server)
            answers.append(message)
            if message.kind == _wire.ERROR_RESPONSE:
                raise AssertionError(f"{text!r} failed: {_wire.error_fields(message.body)}")
            if message.kind == _wire.READY_FOR_QUERY:
                return answers

    def _server_message(self, server: socket.socket) -> Message:
        while not self._pending:
            data = server.recv(65536)
            if not data:
                self._server_framer.end()
                raise EOFError("the server closed the session")
            self._pending = self._server_framer.feed(data)
        return self._pending.pop(0)


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the client closed during its startup")
        data += chunk
    return data
