"""Transaction mode's loans: a transaction run on another process's idle server connection.

A borrower's router that finds no idle server connection of its own process reserves
the unit of another process's idle one in the pool table (the checkout's borrow) and
carries its client's transaction to that owner's router over the owner's loan socket
(:meth:`~._client_pool.ClientPool.loan_socket`): the 48-byte lease frame of
:mod:`orbitive.pool.session`, the loan header (:mod:`._loan_header`: the client's
tracked settings), then the client's messages as the protocol frames them, with the
statement names the borrower gave them (:mod:`._statement_names`). The owner's router
serves them on the reserved connection as it serves a client of its own, and answers
with the server's messages. Three messages of the loan's own, with type bytes the
protocol does not use (it uses ASCII letters), never reach a driver:

* :data:`ACCEPTED` (owner to borrower, ``u8`` 0): the owner took the lease and lent
  the connection; a borrower that reads end of stream instead tries another way.
* :data:`STATEMENT` (borrower to owner): before a ``Bind`` or ``Describe`` of a
  prepared statement, that statement's ``Parse`` body, so that the owner can prepare
  it on its connection first if it is not there already (:class:`LentStatements`).
  The design's pull (the owner asking for what it misses) is left for the C router;
  the reference pushes, which costs the statement's text on the loan each time.
* :data:`DONE` (owner to borrower): the transaction ended, and how (:func:`done`):
  the connection went back to its pool (the loan ends, and the socket waits for the
  borrower's next loan to this owner: :mod:`._kept_loans`), or the client is pinned
  to it (its next transactions go over the same loan); and what the checks found,
  so both routers keep the same :class:`~._client_state.ClientState`.

Only the same user's processes connect: the socket is 0600, a borrower checks it is
ours before it connects, and the owner compares the peer's ``SO_PEERCRED`` uid.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from typing import Any, Final, final

from .._core._access import euid
from .._core._errors import BusyError, DrainingError, MalformedError, OrbitError, StaleError
from ..pool import Lease
from ..pool.session import encode_frame
from . import _wire
from ._kept_loans import KeptLoans
from ._loan_header import LoanHeader
from ._remote import ours
from ._statement_names import Op, Statement, statement_of
from ._wire import Message

#: Owner to borrower: the loan is accepted (``u8`` 0).
ACCEPTED: Final = 0xF3
#: Borrower to owner: the ``Parse`` body of a statement the next message uses.
STATEMENT: Final = 0xF1
#: Owner to borrower: the transaction ended (:func:`done`).
DONE: Final = 0xF2
_DONE: Final = struct.Struct("!BB")
#: :data:`DONE`'s outcomes.
RELEASED: Final = 0
PINNED: Final = 1
#: :data:`DONE`'s findings, or'ed.
FOUND_STATE: Final = 1
FOUND_SETTINGS: Final = 2
#: Seconds a borrower waits for an owner to accept a loan.
ACCEPT_TIMEOUT_S: Final = 5.0
#: How long an owner may keep a loan, in milliseconds (the header's ``lease_ms``).
LEASE_MS: Final = 300_000
_STATEMENT_USERS: Final = frozenset({_wire.BIND, _wire.DESCRIBE})


def done(*, released: bool, state: bool = False, settings: bool = False) -> Message:
    """The owner's :data:`DONE`: released or pinned, and what the checks found."""
    found = (FOUND_STATE if state else 0) | (FOUND_SETTINGS if settings else 0)
    return Message(DONE, _DONE.pack(RELEASED if released else PINNED, found))


def read_done(body: bytes) -> tuple[bool, bool, bool]:
    """(released, state found, settings found) of a :data:`DONE` body.

    Raises:
        MalformedError: not two bytes of a known outcome and findings.
    """
    if len(body) != _DONE.size:
        raise MalformedError(f"a loan's end has {len(body)} bytes, not {_DONE.size}")
    outcome, found = _DONE.unpack(body)
    if outcome not in (RELEASED, PINNED) or found & ~(FOUND_STATE | FOUND_SETTINGS):
        raise MalformedError(f"a loan's end says {outcome}, {found:#x}")
    return outcome == RELEASED, bool(found & FOUND_STATE), bool(found & FOUND_SETTINGS)


def peer_is_us(sock: socket.socket) -> bool:
    """Whether the process at the other end of a Unix socket runs as this user."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return bool(uid == euid())


def borrow(
    pool: Any, settings: dict[bytes, bytes], kept: KeptLoans
) -> tuple[socket.socket, str] | None:
    """A loan of another process's idle server connection of ``pool`` (a
    :class:`~._client_pool.ClientPool`), for a client with these tracked
    ``settings``: the socket to its owner's router, accepted, and the path of the
    owner's loan socket (where to keep it between loans); None when no other process
    has one idle, or its owner could not take the loan (it went away, or the
    connection did). The lease goes on a socket ``kept`` for that owner, else on a
    new one. Blocks (connects, waits for the answer): run it in a thread of its own.

    Raises:
        BaseException: one that interrupted it (KeyboardInterrupt), once the
            reservation is withdrawn.
    """
    lease = _reserve(pool)
    if lease is None:
        return None
    opening = encode_frame(lease) + LoanHeader(0, 0, LEASE_MS, tuple(settings.items())).encode()
    try:
        path = pool.loan_socket(lease.id.node)
        sock = kept.take(path)
        if sock is not None:
            try:
                return _accepted(sock, opening), path
            except OSError:
                sock.close()  # its owner closed it since: the lease goes on a new one
        if not ours(path):
            raise ConnectionRefusedError(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(ACCEPT_TIMEOUT_S)
            sock.connect(path)
            return _accepted(sock, opening), path
        except BaseException:
            sock.close()
            raise
    except BaseException as error:
        with contextlib.suppress(OrbitError):  # refused harmlessly once the owner took it
            pool.pool.cancel_reservation(lease)
        if isinstance(error, OSError):
            return None
        raise


def _accepted(sock: socket.socket, opening: bytes) -> socket.socket:
    """Send a loan's lease frame and header on ``sock`` and wait for the owner's
    :data:`ACCEPTED`: the socket, non-blocking from now on.

    Raises:
        OSError: the socket broke, or the owner answered anything else.
    """
    sock.settimeout(ACCEPT_TIMEOUT_S)
    sock.sendall(opening)
    answer = sock.recv(_wire.HEADER.size + 1, socket.MSG_WAITALL)
    if answer != _wire.frame(ACCEPTED, b"\0"):
        raise ConnectionResetError("the owner did not take the loan")
    sock.setblocking(False)
    return sock


def _reserve(pool: Any) -> Lease | None:
    """Reserve one unit of another process's idle server connection, or None."""
    for candidate in pool.pool.candidates(pool.key):
        if candidate.local or candidate.state != "live" or candidate.free <= 0:
            continue
        try:
            lease: Lease = pool.pool.reserve(candidate.id)
        except (BusyError, StaleError, DrainingError):
            continue
        return lease
    return None


@final
class LoanStatements:
    """The borrower's side of a loan in place of a server connection's
    :class:`~._server_statements.ServerStatements`: the owner keeps what is prepared
    on its connection, so each client message goes to it as the client's
    :class:`~._statement_names.StatementNames` renamed it, a ``Bind`` or ``Describe``
    of a statement preceded by that statement (:data:`STATEMENT`), and every answer
    comes back as the client gets it."""

    def send(self, op: Op) -> tuple[list[Message], list[Message]]:
        """What goes to the owner for a client message, and nothing for the client now."""
        if op.statement is not None and op.message.kind in _STATEMENT_USERS:
            return [Message(STATEMENT, op.statement.parse().body), op.message], []
        return [op.message], []

    def answer(self, message: Message) -> list[Message]:
        """The owner's answers are the client's already."""
        return [message]

    def ran_query(self) -> None:
        """The borrower's router runs nothing of its own over a loan."""

    def forget_all(self) -> None:
        """The owner forgets what its connection no longer prepares."""


@final
class LentStatements:
    """The owner's side of a loan in place of a client's
    :class:`~._statement_names.StatementNames`: the borrower renamed the messages
    already, so each is turned back into the :class:`~._statement_names.Op` the
    borrower's router made of it, with the statement a :data:`STATEMENT` before it
    named."""

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next: Statement | None = None

    def op(self, message: Message) -> Op | None:
        """The op of a borrower's message; None for a :data:`STATEMENT`, which only
        says what the next message uses.

        Raises:
            MalformedError: a ``Parse``, ``Bind``, ``Describe``, ``Close`` or
                :data:`STATEMENT` that is not well formed, or a statement's name that
                is not the digest of its types and text.
        """
        kind = message.kind
        if kind in (STATEMENT, _wire.PARSE):
            name, text, types = _wire.parse_statement(message.body)
            statement = statement_of(types, text, named=bool(name))
            if name != statement.name:
                raise MalformedError(f"a loan names statement {name!r} by another digest")
            if kind == STATEMENT:
                self._next = statement
                return None
            return Op(message, statement)
        used, self._next = self._next, None
        if kind == _wire.CLOSE and _wire.target(message.body)[0] == ord("S"):
            return Op(message, close=True)
        if kind in _STATEMENT_USERS and used is not None:
            if kind == _wire.BIND:
                _, name, _ = _wire.bind_names(message.body)
            else:
                name = _wire.target(message.body)[1]
            if name != used.name:
                raise MalformedError(f"a loan binds {name!r} after statement {used.name!r}")
        return Op(message, used if kind in _STATEMENT_USERS else None)

    def forget_all(self) -> None:
        """The borrower's router keeps the client's statements; nothing to forget here."""
