"""The ends transaction mode's router serves between: client connections (a driver's,
or, in the owner, another process's router lending one client's transaction), and
what runs their transactions (a server connection while the router holds it, or, in
the borrower, a loan of another process's). Each keeps its socket, what is still to
be written to it, and what the router knows of its side; :class:`~._router.Router`
decides everything.
"""

from __future__ import annotations

import collections
import os
import socket
from collections.abc import Callable
from typing import Any, Final

from . import _loans, _startup, _wire
from ._client_state import ClientState, Outcome
from ._server_statements import ServerStatements
from ._statement_names import StatementNames
from ._wire import Framer, Message

#: The most bytes one read takes from a socket.
READ_SIZE: Final = 65536


class Session:
    """What the router knows of one server connection's session, kept between the
    transactions it serves: its framing, the statements prepared on it, and the
    settings it reports (libpq's own record of them goes stale: nobody reads it)."""

    __slots__ = ("framer", "reported", "statements")

    def __init__(self, conn: Any, max_prepared: int) -> None:
        self.framer = Framer(_wire.BACKEND, _wire.BACKEND_MESSAGE_MAX)
        self.statements = ServerStatements(max_prepared)
        self.reported = {
            name: value
            for name in _startup.REPORTED
            if (value := conn.pgconn.parameter_status(name)) is not None
        }


class Endpoint:
    """One side's socket, with what is still to be written to it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.setblocking(False)
        self.out = bytearray()
        self.gone = False


class ServerConnection(Endpoint):
    """One server connection while the router holds it: the libpq connection that
    opened it (never used meanwhile), a socket of its own on the same connection, its
    :class:`Session` (the same objects, updated in place), and what giving it back
    (``release``) and dropping it (``discard``) do with it: the pool's, or, lent to
    another process's client, the loan's."""

    def __init__(
        self,
        conn: Any,
        session: Session,
        release: Callable[[], None],
        discard: Callable[[], None],
    ) -> None:
        super().__init__(socket.socket(fileno=os.dup(conn.pgconn.socket)))
        self.conn = conn
        self.framer, self.statements = session.framer, session.statements
        self.reported = session.reported
        self.release, self.discard = release, discard
        self.client: Client | None = None
        #: The router's own statement running, and what to do with its answers.
        self.internal: list[Message] | None = None
        self.then: Callable[[list[Message]], None] | None = None
        self.cancelling = 0  # cancel requests on their way to the server
        self.held = False  # given back while cancelling: idle once they arrived


class Loan(Endpoint):
    """A loan of another process's server connection, in the borrower: the socket to
    its owner's router, which keeps what is prepared on the connection (the
    statements here only pass the client's on, :class:`~._loans.LoanStatements`)."""

    def __init__(self, sock: socket.socket, reported: dict[bytes, bytes], owner: str) -> None:
        super().__init__(sock)
        self.owner = owner  # the path of the owner's loan socket
        self.framer = Framer(_wire.BACKEND | {_loans.DONE}, _wire.BACKEND_MESSAGE_MAX)
        self.statements = _loans.LoanStatements()
        self.reported = reported
        self.client: Client | None = None
        # Never set: the owner runs the checks and the cancels.
        self.internal: list[Message] | None = None
        self.then: Callable[[list[Message]], None] | None = None
        self.cancelling = 0
        self.held = False
        #: The transaction ended here; the owner's DONE (released or pinned) is due.
        self.done_due: Outcome | None = None
        self.released = False  # the owner's DONE said released: the loan ended

    @property
    def reusable(self) -> bool:
        """Whether the socket may carry the borrower's next loan to the same owner: the
        loan ended released, with nothing of it left to write or read."""
        return self.released and not self.out and not self.framer.pending

    def release(self) -> None:
        """Nothing: the owner gives its connection back (closing the socket ends the loan)."""

    discard = release


#: What serves a client's transactions: a server connection, or a loan of one.
SERVER_SIDE: Final = (ServerConnection, Loan)


class Client(Endpoint):
    """One driver connection: its startup bytes, then its messages and state."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        self.first = b""  # the startup packet, until it is whole
        self.framer: Framer | None = None
        self.state = ClientState()  # replaced once its startup is read
        self.names: StatementNames | _loans.LentStatements = StatementNames()
        self.queued: collections.deque[Message] = collections.deque()
        self.server: ServerConnection | Loan | None = None
        self.secret = -1  # of its BackendKeyData, once started
        self.sent = False  # a message went on since the last ReadyForQuery
        self.awaiting = False  # a Sync or Query went on; its ReadyForQuery has not come
        self.in_block = False  # the last ReadyForQuery said T or E


class Borrower(Client):
    """Another process's router, in the owner: its lease frame and loan header, then
    one client's messages, served on the server connection the lease names."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        self._await_loan()

    def _await_loan(self) -> None:
        """What a loan starts from: no lease frame read, nothing of a client's."""
        self.first, self.framer, self.state = b"", None, ClientState()
        self.names = _loans.LentStatements()
        self.sent = self.awaiting = self.in_block = False
        #: ``time.monotonic()`` seconds at which the loan's lease ends (its header's
        #: ``lease_ms`` after the accept), once accepted.
        self.lease_ends = float("inf")

    def between_loans(self) -> bool:
        """Wait for the borrower's next loan on this socket (its next lease frame), its
        loan having ended released; False when the borrower sent more on the loan
        than it may (it waits for the owner's DONE before anything else)."""
        if self.queued or self.framer is None or self.framer.pending:
            return False
        self._await_loan()
        return True


def receive(endpoint: Endpoint) -> bytes | None:
    """What the socket has to read: None when nothing yet, ``b""`` when it ended or
    broke."""
    try:
        return endpoint.sock.recv(READ_SIZE)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def partner(endpoint: Endpoint) -> Endpoint | None:
    """The other side of what a client or server connection carries now."""
    if isinstance(endpoint, SERVER_SIDE):
        return endpoint.client
    assert isinstance(endpoint, Client)
    return endpoint.server
