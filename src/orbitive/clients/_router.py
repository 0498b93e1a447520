"""Transaction mode's router, in Python: the reference the C router will be measured by.

One thread serves every client connection of the router's process on a Unix socket
(``{folder}/.s.PGSQL.{port}``, where libpq and asyncpg look for one) and runs each
client's transactions on server connections of the key's pool (its
:class:`ServerSupply`): an idle one of this process, else the client waits, first
come first served, for the next one a transaction gives back or the pool hands over
(docs/architecture.md, "Transaction mode: the plan"). A transaction's connection
goes back to the pool when it ends, so the pool's table counts it idle between
transactions. It answers each driver's
startup itself (:mod:`._startup`), renames statements and writes the answers it
owes (:mod:`._statement_names`, :mod:`._server_statements`), decides where a
transaction ends and what pins (:mod:`._client_state`), gives each client its
tracked settings on every connection, and runs the checks, refusals and clean-ups
on the server connection itself, their answers swallowed.

What one read from a server connection gives goes on to its clients in one write
each, as the server wrote it (a statement's answer with the ``ReadyForQuery`` after
it): a router killed between two writes would leave its client an answer without its
end, and the connection's loss after it, which libpq counts as a second result
(psycopg: "received 2 results from command 'BEGIN'") instead of a lost connection.
Every socket is non-blocking, with a buffer of what is still to be written: a
client that does not read its answers holds up only its own server connection
(whose reading stops while that client's buffer holds more than
:data:`BUFFER_HIGH` bytes), never the other clients. A client's messages go on
one ``Sync`` (or ``Query``) at a time: the next waits for the ``ReadyForQuery`` of
the last, so a transaction's end is decided with nothing of the client's in flight.
A client that leaves with anything sent since its last ``ReadyForQuery``, or inside
a transaction block, takes its server connection with it (closed: the server rolls
back); one that leaves pinned has it cleaned (``DISCARD ALL``) before anyone else
gets it. A cancel request holds the server connection until it has reached the
server, so it never cancels the statement of a client served after.

The router's thread never blocks: it asks the pool for an idle connection with
:meth:`ServerSupply.take_idle`, and a client that finds none waits while a taker
thread (kept from one checkout to the next) runs :meth:`ServerSupply.getconn` (which
may open a connection under ``max_live``, or wait for one). What the router knows of
a connection's session (the statements prepared on it, its reported settings) stays
with the connection between transactions. A connection that broke is discarded, and
the pool opens another for the next waiting client; one the pool cannot give within
its timeout ends the oldest waiting client's connection with ``FATAL`` 53300.

A client of another process's router borrows a connection this router holds idle
(:mod:`._loans`): it is served as a client of this process is, until its
transaction ends or the loan's lease does.

This is the reference, not the fast path: the thread takes the GIL for every
message.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import logging
import os
import queue
import secrets
import selectors
import socket
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, final

from .._core._errors import AccessDenied, MalformedError, OrbitError, PoolTimeout
from ..pool.session import FRAME_SIZE, decode_frame
from . import _loan_header, _loans, _startup, _wire
from ._client_state import (
    STATE_CHECK,
    TRACKED,
    Checks,
    ClientState,
    Outcome,
    restore_query,
    settings_check,
)
from ._kept_loans import KeptLoans
from ._remote import ours
from ._router_ends import (
    SERVER_SIDE,
    Borrower,
    Client,
    Endpoint,
    Loan,
    ServerConnection,
    Session,
    partner,
    receive,
)
from ._startup import Cancel
from ._wire import Framer, Message

#: Bytes waiting to be written to one side above which the other side is not read.
BUFFER_HIGH: Final = 1 << 20
_COPY: Final = frozenset({_wire.COPY_DATA, _wire.COPY_DONE, _wire.COPY_FAIL})
#: Client messages whose answers end with a ``ReadyForQuery``.
_ANSWERED_BY_READY: Final = frozenset({_wire.SYNC, _wire.QUERY, _wire.FUNCTION_CALL})
_DEALLOCATING: Final = frozenset({b"DISCARD ALL\0", b"DEALLOCATE ALL\0"})
_EMPTY_ANSWER: Final = (
    Message(_wire.EMPTY_QUERY_RESPONSE, b""),
    _wire.ready_for_query(_wire.IDLE),
)
#: Seconds the router stops accepting after the process ran out of descriptors.
_ACCEPT_PAUSE_S: Final = 0.1
#: Seconds a closing router lets other processes' transactions on its connections
#: run on before it ends them as a vanished borrower's.
LOAN_CLOSE_WAIT_S: Final = 5.0
_CLOSING_TICK_S: Final = 0.02
_OUT_OF_DESCRIPTORS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_log = logging.getLogger("orbitive.clients")


class ServerSupply(Protocol):
    """Where the router's server connections come from and go back to: transaction
    mode's :class:`~._client_pool.ClientPool` of psycopg connections (autocommit, of
    one role and database, opened alike, ``lends=True``), whose methods these are."""

    key: Any

    @property
    def pool(self) -> Any:
        """The pool table's handle (reservations, candidates, accepting leases)."""

    def take_idle(self) -> Any | None:
        """An idle connection of this process, or None at once (never blocks)."""

    def getconn(self, timeout: float | None = None) -> Any:
        """A connection, waiting or opening one (raises when none comes in time)."""

    def getconn_or_borrow(self, borrow: Callable[[], Any], timeout: float | None = None) -> Any:
        """:meth:`getconn`, or what ``borrow()`` gave (a loan), tried before each wait."""

    def lend(self, rid: Any, accept: Callable[[], Any]) -> tuple[Any, Any] | None:
        """Accept a lease (``accept()``) and lend the idle connection it names, until
        :meth:`lent_back`: (what ``accept`` gave, the connection), or None."""

    def lent_back(self, client: Any, *, keep: bool, complete: Callable[[], object]) -> None:
        """A lent connection idle again, or (not ``keep``) closed; ``complete()`` gives
        the lease's unit back."""

    def loan_socket(self, node: int) -> str:
        """Where the routers of node ``node`` take loans."""

    def putconn(self, client: Any) -> None:
        """Hand a connection back, idle between transactions."""

    def discard(self, client: Any) -> None:
        """Close a connection that broke, or holds a session no one may inherit."""

    def close(self) -> None:
        """Close every connection; a ``getconn`` still waiting then raises at once."""


@final
class Router:
    """Serves drivers' connections on server connections of the key's pool.

    Args:
        folder: the directory of the listening socket (created 0700 if missing).
        port: the number in the socket's name, ``.s.PGSQL.{port}`` (what a driver
            is given as its port).
        supply: the pool of server connections (see :class:`ServerSupply`), the
            router's own: only the router uses its connections, and :meth:`close`
            closes it. The router lends its idle ones to the routers of the pool's
            other processes on :meth:`ServerSupply.loan_socket`, and borrows theirs.
        refuse: ``on_session_state="refuse"``.
        max_prepared: statements kept prepared per server connection.
        wait_timeout: seconds a transaction waits for a server connection (float
            > 0); None: the pool's own ``acquire_timeout``.

    Raises:
        OSError: a socket cannot be bound.
        AccessDenied: the loan socket's path is taken by something not ours.
        Exception: one from ``supply.getconn()``, which the router calls once to
            learn the role, the database and what a fresh session reports
            (``PoolTimeout``, ``ClientCreateError``, ...).
    """

    def __init__(
        self,
        folder: str,
        port: int,
        supply: ServerSupply,
        *,
        refuse: bool = False,
        max_prepared: int = 256,
        wait_timeout: float | None = None,
    ) -> None:
        first = supply.getconn(wait_timeout)
        try:
            self._user, self._database = first.info.user, first.info.dbname
            #: What a fresh session reports: what a new client is told and starts with.
            self._fresh = dict(Session(first, max_prepared).reported)
        finally:
            supply.putconn(first)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self.path = os.path.join(folder, f".s.PGSQL.{port}")
        self._supply, self._wait_timeout = supply, wait_timeout
        self._refuse, self._max_prepared = refuse, max_prepared
        #: The connections the router holds now (serving a client, or its own statement).
        self._servers: list[ServerConnection | Loan] = []
        self._sessions: weakref.WeakKeyDictionary[Any, Session] = weakref.WeakKeyDictionary()
        self._settings_check = settings_check(TRACKED, self._user.encode())
        self._waiting: collections.deque[Client] = collections.deque()
        self._taking = 0  # getconn calls running, or asked for, for waiting clients
        #: The checkouts asked for (a client's settings; None: a taker's end), the
        #: threads that run them (kept between checkouts), and how many of those wait
        #: for the next, unclaimed.
        self._asks: queue.SimpleQueue[dict[bytes, bytes] | None] = queue.SimpleQueue()
        self._takers: list[threading.Thread] = []
        self._idle_takers = 0
        self._takers_lock = threading.Lock()
        #: Loan sockets to other processes' routers, idle between loans.
        self._kept = KeptLoans()
        self._by_secret: dict[int, Client] = {}
        #: While a server's read is passed on: the clients written to, flushed at its end.
        self._held: list[Client] | None = None
        self._posted: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._post_lock = threading.Lock()
        self._shut_down = False  # posted work then runs its orphan instead
        self._stopping = False
        self._accept_again = 0.0  # monotonic time to accept again after EMFILE; 0: now
        self._selector = selectors.DefaultSelector()
        self.loan_path = supply.loan_socket(supply.pool.node)
        if os.path.lexists(self.loan_path) and not ours(self.loan_path):
            raise AccessDenied(f"{self.loan_path!r} is not a socket of ours; refusing it")
        self._listener = _listening(self.path)
        self._loan_listener = _listening(self.loan_path)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        for listener in (self._listener, self._loan_listener, self._wake_r):
            self._selector.register(listener, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name="orbitive-router", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving: no client or loan is accepted any more; the transactions
        other processes run on this router's connections may end, for at most
        :data:`LOAN_CLOSE_WAIT_S`; then every client connection is closed (one inside
        a transaction is told), and the pool, once the connections the router held
        are back in it or, one a client left in a transaction, closed. Returns once no
        thread of the router asks the pool any more. Calling it again does nothing."""
        if self._stopping:
            return
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join()
        self._wake_w.close()
        self._supply.close()  # a getconn still waiting raises now
        for _ in self._takers:
            self._asks.put(None)
        for taker in self._takers:
            taker.join()
        self._kept.close()

    @property
    def server_connections(self) -> int:
        """How many server connections the router holds now."""
        return len(self._servers)

    @property
    def waiting(self) -> int:
        """How many clients wait for a server connection, now."""
        return len(self._waiting)

    # -- the loop ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            closing_until = None
            while True:
                if self._stopping:
                    if closing_until is None:
                        closing_until = time.monotonic() + LOAN_CLOSE_WAIT_S
                        self._stop_accepting()
                    if not self._lending() or time.monotonic() >= closing_until:
                        break
                lease_ends = self._end_overdue_loans()
                for key, mask in self._selector.select(self._select_timeout(lease_ends)):
                    self._dispatch(key, mask)
        finally:
            self._shut()

    def _stop_accepting(self) -> None:
        """Close the listening sockets and remove their paths: a driver or a borrower
        that connects now is refused at once (one in a backlog no one accepts would
        wait for its timeout). Idempotent."""
        for listener, path in ((self._listener, self.path), (self._loan_listener, self.loan_path)):
            if listener.fileno() < 0:
                continue
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(listener)
            listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self._accept_again = 0.0

    def _lending(self) -> bool:
        """Whether another process's client still runs a transaction here."""
        return any(isinstance(server.client, Borrower) for server in self._servers)

    def _select_timeout(self, lease_ends: float | None) -> float | None:
        """Seconds until the loop has something to do besides its sockets: accept again,
        or end a loan at ``lease_ends`` (the first lease to end); None: nothing."""
        if self._stopping:
            return _CLOSING_TICK_S
        now = time.monotonic()
        if self._accept_again and self._accept_again <= now:
            self._accept_again = 0.0
            for listener in (self._listener, self._loan_listener):
                self._selector.register(listener, selectors.EVENT_READ, None)
            return 0.0
        due = [when for when in (lease_ends, self._accept_again or None) if when is not None]
        return max(0.0, min(due) - now) if due else None

    def _end_overdue_loans(self) -> float | None:
        """End each loan whose lease has ended as a vanished borrower's (its transaction
        rolled back with its server connection closed, a pin cleaned), its borrower
        told with ``FATAL`` 57014; return when the first of the other leases ends
        (None: no other process's client holds a connection here)."""
        now, first = time.monotonic(), None
        for server in list(self._servers):
            borrower = server.client
            if not isinstance(borrower, Borrower) or borrower.gone:
                continue  # one that left holds nothing: its connection is being cleaned
            if borrower.lease_ends <= now:
                why = "the loan of this server connection outlived its lease"
                self._write(borrower, [_wire.error_response("FATAL", "57014", why)])
                self._client_gone(borrower)
            elif first is None or borrower.lease_ends < first:
                first = borrower.lease_ends
        return first

    def _dispatch(self, key: selectors.SelectorKey, mask: int) -> None:
        endpoint = key.data
        if endpoint is None:
            if key.fileobj is self._listener:
                self._accept(self._listener, Client)
            elif key.fileobj is self._loan_listener:
                self._accept(self._loan_listener, Borrower)
            else:
                self._posted_work()
            return
        try:
            if mask & selectors.EVENT_WRITE:
                self._flush(endpoint)
                client = endpoint.client if isinstance(endpoint, SERVER_SIDE) else None
                if client is not None and len(endpoint.out) < BUFFER_HIGH:
                    self._pump(client)  # it waited for room in this buffer
            if mask & selectors.EVENT_READ and not endpoint.gone:
                if isinstance(endpoint, SERVER_SIDE):
                    self._server_readable(endpoint)
                else:
                    self._client_readable(endpoint)
        except Exception:  # a bug must cost one connection, never the router
            _log.exception("transaction mode's router dropped a connection after an error")
            self._drop(endpoint)

    def _drop(self, endpoint: Endpoint) -> None:
        if isinstance(endpoint, SERVER_SIDE):
            self._server_gone(endpoint)
        else:
            assert isinstance(endpoint, Client)
            self._client_gone(endpoint)

    def _post(self, work: Callable[[], None], orphan: Callable[[], None]) -> None:
        """Have the router's thread run ``work`` (from another thread); once it has
        stopped, run ``orphan`` here instead."""
        with self._post_lock:
            if self._shut_down:
                orphan()
                return
            self._posted.put(work)
            with contextlib.suppress(OSError):
                self._wake_w.send(b"w")

    def _posted_work(self) -> None:
        with contextlib.suppress(BlockingIOError):
            self._wake_r.recv(4096)
        while True:
            try:
                work = self._posted.get_nowait()
            except queue.Empty:
                return
            work()

    def _accept(self, listener: socket.socket, kind: type[Client]) -> None:
        try:
            sock, _ = listener.accept()
        except BlockingIOError:
            return
        except OSError as error:
            if error.errno not in _OUT_OF_DESCRIPTORS:
                raise
            _log.warning("transaction mode's router stops accepting for %.1f s: %s",
                         _ACCEPT_PAUSE_S, error)  # fmt: skip
            for paused in (self._listener, self._loan_listener):
                self._selector.unregister(paused)
            self._accept_again = time.monotonic() + _ACCEPT_PAUSE_S
            return
        if kind is Borrower and not _loans.peer_is_us(sock):
            sock.close()  # only this user's processes borrow
            return
        client = kind(sock)
        self._selector.register(sock, selectors.EVENT_READ, client)

    def _shut(self) -> None:
        for server in list(self._servers):
            unused = server.client is None and server.internal is None and not server.out
            if unused and not server.cancelling:
                self._release(server)
            else:
                self._server_gone(server)
        for key in list(self._selector.get_map().values()):
            if isinstance(key.data, Client):
                self._client_gone(key.data)
        with self._post_lock:
            self._shut_down = True
        self._posted_work()  # connections that came meanwhile go back
        self._stop_accepting()
        self._wake_r.close()
        self._selector.close()

    # -- writing, with backpressure --------------------------------------------------------

    def _write(self, endpoint: Endpoint, messages: Sequence[Message]) -> None:
        """Queue ``messages`` for ``endpoint`` and write what the socket takes now, or,
        to a client while a server's read is passed on, once all of it is."""
        if endpoint.gone or not messages:
            return
        endpoint.out += b"".join(message.frame() for message in messages)
        if self._held is not None and isinstance(endpoint, Client):
            if endpoint not in self._held:
                self._held.append(endpoint)
            return
        self._flush(endpoint)

    def _flush(self, endpoint: Endpoint) -> None:
        try:
            while endpoint.out:
                sent = endpoint.sock.send(endpoint.out)
                del endpoint.out[:sent]
        except BlockingIOError:
            pass
        except OSError:
            self._drop(endpoint)
            return
        self._watch(endpoint)
        other = partner(endpoint)
        if other is not None:
            self._watch(other)  # read the other side only while this one has room

    def _watch(self, endpoint: Endpoint) -> None:
        """Register what the endpoint waits for: room to write its buffer, and bytes to
        read unless the side it feeds holds :data:`BUFFER_HIGH` bytes unwritten."""
        if endpoint.gone:
            return
        fed = partner(endpoint)
        reading = fed is None or len(fed.out) < BUFFER_HIGH
        events = (selectors.EVENT_READ if reading else 0) | (
            selectors.EVENT_WRITE if endpoint.out else 0
        )
        key = self._selector.get_map().get(endpoint.sock)
        if not events:
            if key is not None:
                self._selector.unregister(endpoint.sock)
        elif key is None:
            self._selector.register(endpoint.sock, events, endpoint)
        elif key.events != events:
            self._selector.modify(endpoint.sock, events, endpoint)

    # -- clients -------------------------------------------------------------------------

    def _client_readable(self, client: Client) -> None:
        data = receive(client)
        if data is None:
            return
        if not data:
            self._client_gone(client)
            return
        try:
            if client.framer is not None:
                client.queued += client.framer.feed(data)
            elif isinstance(client, Borrower):
                self._loan_taken(client, data)
            else:
                self._startup(client, data)
        except MalformedError as error:
            self._write(client, [_wire.error_response("FATAL", "08P01", str(error))])
            self._client_gone(client)
            return
        self._pump(client)

    def _loan_taken(self, client: Borrower, data: bytes) -> None:
        """The start of a loan: once the lease frame and the loan header are whole, the
        lease is accepted and the connection it names lent to the borrower's client
        (told :data:`~._loans.ACCEPTED`) until the header's ``lease_ms`` has passed
        (:meth:`_end_overdue_loans`); a lease refused, or a connection gone, ends the
        loan, and the borrower tries another way.

        Raises:
            MalformedError: a malformed lease frame or loan header.
        """
        client.first += data
        decoded = _loan_header.decode(client.first[FRAME_SIZE:])
        if decoded is None:
            return
        header, size = decoded
        lease = decode_frame(client.first[:FRAME_SIZE])
        try:
            lent = self._supply.lend(lease.id, functools.partial(self._supply.pool.accept, lease))
        except OrbitError:  # stale, replayed, aged out, another node's: nothing accepted
            self._client_gone(client)
            return
        if lent is None:  # retired since the reservation: nothing accepted
            self._client_gone(client)
            return
        execution, conn = lent
        rest, client.first = client.first[FRAME_SIZE + size :], b""

        def back(keep: bool) -> None:
            self._supply.lent_back(conn, keep=keep, complete=execution.complete)

        client.state = ClientState(refuse=self._refuse, reported=dict(header.settings))
        client.lease_ends = time.monotonic() + header.lease_ms / 1000
        client.framer = Framer(_wire.FRONTEND | {_loans.STATEMENT})
        self._write(client, [Message(_loans.ACCEPTED, b"\0")])
        self._bind(client, conn, functools.partial(back, True), functools.partial(back, False))
        client.queued += client.framer.feed(rest)

    def _startup(self, client: Client, data: bytes) -> None:
        client.first += data
        while client.framer is None and (packet := _startup.read_first_packet(client.first)):
            first, size = packet
            client.first = client.first[size:]
            if isinstance(first, _startup.EncryptionRequest):
                client.sock.send(_startup.NO_ENCRYPTION)  # nothing is buffered yet
                continue
            if isinstance(first, Cancel):
                self._cancel(first)
                self._client_gone(client)  # a cancel request gets no answer
                return
            why = _startup.refusal(
                first, user=self._user, database=self._database, fixed={}, tracked=TRACKED
            )
            if why is not None:
                self._write(client, [_wire.error_response("FATAL", "28000", why)])
                self._client_gone(client)
                return
            settings = {**self._fresh, **_startup.tracked_settings(first, TRACKED)}
            client.state = ClientState(refuse=self._refuse, reported=settings)
            client.secret = secrets.randbits(31)
            while client.secret in self._by_secret:
                client.secret = secrets.randbits(31)
            self._by_secret[client.secret] = client
            answer = _startup.startup_answer(settings, Cancel(os.getpid(), client.secret))
            client.out += answer
            client.framer = Framer(_wire.FRONTEND)
            client.queued += client.framer.feed(client.first)
            self._flush(client)

    def _pump(self, client: Client) -> None:
        """Pass on what the client sent, as far as its turn, its last ``Sync`` and its
        server connection's buffer allow."""
        while client.queued and not client.gone and client.framer is not None:
            message = client.queued[0]
            if client.awaiting and message.kind not in _COPY:
                return
            if message.kind == _wire.TERMINATE:
                self._client_gone(client)
                return
            if client.server is None and isinstance(client, Borrower):
                self._client_gone(client)  # its loan was released: it has no more
                return
            if client.server is None and message.kind == _wire.QUERY and message.body == b"\0":
                client.queued.popleft()  # an empty query (a pool's check): answered here
                self._write(client, _EMPTY_ANSWER)
                continue
            server = client.server or self._take(client)
            if server is None or server.internal is not None or server.cancelling:
                return
            if isinstance(server, Loan) and server.done_due is not None:
                return  # the owner's DONE says where the next transaction runs
            if len(server.out) >= BUFFER_HIGH:
                return  # resumed when the server's buffer drains
            client.queued.popleft()
            op = client.names.op(message)
            if op is None:
                continue  # a statement the borrower's next message uses
            client.state.from_client(op.message)
            to_server, now = server.statements.send(op)
            client.sent = True
            client.awaiting = client.awaiting or message.kind in _ANSWERED_BY_READY
            self._write(server, to_server)
            self._write(client, now)

    def _take(self, client: Client) -> ServerConnection | None:
        """A server connection for the client's next transaction, with its settings;
        None while it waits its turn (a thread then asks the pool for one)."""
        if self._waiting and self._waiting[0] is not client:
            if client not in self._waiting:
                self._waiting.append(client)
                self._ask_pool()  # a checkout of its own, as every waiting client has
            return None
        conn = self._supply.take_idle()
        if conn is None:
            if not self._waiting:
                self._waiting.append(client)
            self._ask_pool()
            return None
        if self._waiting:
            self._waiting.popleft()
        return self._bind(client, conn)

    def _bind(
        self,
        client: Client,
        conn: Any,
        release: Callable[[], None] | None = None,
        discard: Callable[[], None] | None = None,
    ) -> ServerConnection:
        """Bind a server connection to the client, with the client's settings. Given
        back or dropped, it goes back to the pool (``release`` and ``discard`` say
        otherwise for one lent to another process)."""
        session = self._sessions.get(conn)
        if session is None:
            session = self._sessions[conn] = Session(conn, self._max_prepared)
        server = ServerConnection(
            conn,
            session,
            release or functools.partial(self._supply.putconn, conn),
            discard or functools.partial(self._supply.discard, conn),
        )
        self._servers.append(server)
        server.client, client.server = client, server
        self._watch(server)
        query = restore_query(client.state.settings, server.reported)
        if query is not None:
            self._internal(server, query, lambda _: self._pump(client))
        return server

    def _ask_pool(self) -> None:
        """As many checkouts running as clients waiting, each in a taker thread (an idle
        one, else a new one): each may borrow another process's idle connection for
        the settings of the client it was asked for."""
        while self._taking < len(self._waiting):
            self._asks.put(dict(self._waiting[self._taking].state.settings))
            self._taking += 1
            with self._takers_lock:
                if self._idle_takers:
                    self._idle_takers -= 1  # that one takes this ask
                    continue
            taker = threading.Thread(target=self._taker, name="orbitive-router-take", daemon=True)
            self._takers.append(taker)
            taker.start()

    def _taker(self) -> None:
        """A taker thread: run the checkouts asked for, one after the other, until the
        router closes. It counts itself idle before the router learns the outcome, so
        that the client's next checkout finds it."""
        while (settings := self._asks.get()) is not None:
            work, orphan = self._checkout(settings)
            with self._takers_lock:
                self._idle_takers += 1
            self._post(work, orphan)

    def _checkout(
        self, settings: dict[bytes, bytes]
    ) -> tuple[Callable[[], None], Callable[[], None]]:
        """Check out a connection, or borrow one for ``settings``: what the router's
        thread then does with it, and what is done with it once the router stopped."""
        borrow = functools.partial(_loans.borrow, self._supply, settings, self._kept)
        try:
            got = self._supply.getconn_or_borrow(borrow, self._wait_timeout)
        except Exception as error:
            return functools.partial(self._not_given, error), lambda: None
        if isinstance(got, tuple):
            sock, owner = got
            return functools.partial(self._lent, sock, owner, settings), sock.close
        return functools.partial(self._given, got), lambda: self._supply.putconn(got)

    def _given(self, conn: Any) -> None:
        """A connection the pool handed over: the oldest waiting client's."""
        self._taking -= 1
        if self._stopping or not self._waiting:
            self._supply.putconn(conn)
            return
        client = self._waiting.popleft()
        self._bind(client, conn)
        self._pump(client)

    def _lent(self, sock: socket.socket, owner: str, settings: dict[bytes, bytes]) -> None:
        """A loan of another process's connection, asked for a client with these
        settings (the owner gave the connection those): the oldest waiting client's
        with the same settings, which may wait behind clients with others (each has a
        checkout of its own running); with none, the loan ends unused and a checkout
        starts again."""
        self._taking -= 1
        client = next((c for c in self._waiting if c.state.settings == settings), None)
        if self._stopping or client is None:
            sock.close()
            if not self._stopping:
                self._ask_pool()
            return
        self._waiting.remove(client)
        loan = Loan(sock, settings, owner)
        self._servers.append(loan)
        loan.client, client.server = client, loan
        self._watch(loan)
        self._pump(client)

    def _not_given(self, error: Exception) -> None:
        """The pool gave no connection: the oldest waiting client is told, and closed."""
        self._taking -= 1
        if not self._waiting:
            return
        client = self._waiting.popleft()
        code = "53300" if isinstance(error, PoolTimeout) else "08006"
        why = f"transaction mode got no server connection: {error}"
        self._write(client, [_wire.error_response("FATAL", code, why)])
        self._client_gone(client)

    def _give_back(self, server: ServerConnection | Loan) -> None:
        """The server connection's client is done with it: back to the pool (once no
        cancel request is still on its way to it), then to the oldest waiting client
        if the pool keeps it idle."""
        client = server.client
        if client is not None:
            client.server = None
        server.client = None
        if isinstance(client, Borrower) and not client.gone and not client.between_loans():
            self._client_gone(client)
        if server.gone:
            return
        if server.cancelling:
            server.held = True
            return
        self._release(server)
        if self._waiting:
            self._pump(self._waiting[0])
        if client is not None and client.queued:
            self._pump(client)  # its next transaction, behind those that waited

    def _release(self, server: ServerConnection | Loan) -> None:
        """Give the server connection back to where it came from; the router's socket
        on it closes (on a loan, that ends the loan), or, a loan that ended released,
        is kept for the next loan to the same owner."""
        if isinstance(server, Loan) and server.reusable:
            self._forget(server, close=False)
            self._kept.keep(server.owner, server.sock)
            return
        self._forget(server)
        server.release()

    def _forget(self, server: ServerConnection | Loan, *, close: bool = True) -> None:
        server.gone = True
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(server.sock)
        if close:
            server.sock.close()
        self._servers.remove(server)

    def _client_gone(self, client: Client) -> None:
        if client.gone:
            return
        client.gone = True
        with contextlib.suppress(OSError):
            client.sock.send(client.out)  # a last error, if it fits
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(client.sock)
        client.sock.close()
        if self._by_secret.get(client.secret) is client:
            del self._by_secret[client.secret]
        if client in self._waiting:
            self._waiting.remove(client)
        server = client.server
        if server is None:
            return
        if client.sent or client.in_block or server.internal is not None or server.out:
            self._server_gone(server)  # inside a transaction: closing it rolls it back
        elif client.state.pins and isinstance(server, ServerConnection):  # a loan's owner cleans
            server.statements.forget_all()
            self._internal(server, b"DISCARD ALL", lambda _: self._give_back(server))
        else:
            self._give_back(server)

    def _cancel(self, request: Cancel) -> None:
        """Cancel what the named client runs, where it runs: libpq's cancel request on
        the server connection serving it, from a thread of its own (it connects to the
        server; psycopg's ``cancel_safe`` waits without the GIL). The connection goes
        to no other client before the request reached the server, so it never
        cancels theirs. A key that names no client, or one running nothing, is
        ignored, as the server ignores it.

        A driver in the router's own process must cancel with ``cancel_safe()``:
        psycopg's ``cancel()`` (libpq's ``PQcancel``) holds the GIL while it waits for
        the router's answer, which this router, in Python, cannot then give. A statement
        running on a loan is not cancelled yet (the owner would cancel it on its
        connection: not built)."""
        client = self._by_secret.get(request.secret)
        if request.process != os.getpid() or client is None:
            return
        server = client.server
        if not isinstance(server, ServerConnection) or not client.awaiting:
            return
        server.cancelling += 1

        def send() -> None:
            with contextlib.suppress(Exception):
                server.conn.cancel_safe(timeout=10.0)
            self._post(lambda: self._cancelled(server), lambda: None)

        threading.Thread(target=send, name="orbitive-router-cancel", daemon=True).start()

    def _cancelled(self, server: ServerConnection) -> None:
        server.cancelling -= 1
        if server.cancelling or server.gone:
            return
        if server.held:
            server.held = False
            self._give_back(server)
        elif server.client is not None:
            self._pump(server.client)

    # -- servers -------------------------------------------------------------------------

    def _internal(
        self, server: ServerConnection, text: bytes, then: Callable[[list[Message]], None]
    ) -> None:
        """Run the router's own statement on the server; ``then`` gets its answers."""
        server.internal, server.then = [], then
        server.statements.ran_query()
        self._write(server, [_wire.query(text)])

    def _server_readable(self, server: ServerConnection | Loan) -> None:
        data = receive(server)
        if data is None:
            return
        if not data:
            self._server_gone(server)
            return
        try:
            messages = server.framer.feed(data)
        except MalformedError:
            self._server_gone(server)
            return
        self._held = []
        try:
            for message in messages:
                if server.gone:
                    break
                self._server_message(server, message)
        finally:
            held, self._held = self._held or [], None
            for client in held:
                if not client.gone:
                    self._flush(client)

    def _server_message(self, server: ServerConnection | Loan, message: Message) -> None:
        if isinstance(server, Loan) and message.kind == _loans.DONE:
            self._loan_done(server, message.body)
            return
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
            self._write(client, out)
            if answer.kind == _wire.READY_FOR_QUERY:
                client.awaiting = client.sent = False
                client.in_block = answer.body != b"I"
            self._after(server, client, outcome)
            if client.gone:
                return
        if server.client is client and server.internal is None:
            self._pump(client)

    def _after(self, server: ServerConnection | Loan, client: Client, outcome: Outcome) -> None:
        if isinstance(server, Loan):
            if outcome is not Outcome.CONTINUE:
                server.done_due = outcome  # the owner decides, and says so
            return
        if outcome is Outcome.RELEASE:
            self._ended(server, client, released=True)
        elif outcome is Outcome.PINNED:
            self._ended(server, client, released=False)
        elif outcome is Outcome.REFUSE:
            server.statements.forget_all()
            self._internal(
                server, b"DISCARD ALL", lambda _: self._ended(server, client, released=True)
            )
        elif outcome is Outcome.CHECK:
            checks = client.state.checks
            both = ((Checks.STATE, STATE_CHECK), (Checks.SETTINGS, self._settings_check))
            text = b"; ".join(query for wanted, query in both if wanted in checks)

            def decide(answers: list[Message]) -> None:
                found = _found(answers, len([1 for wanted, _ in both if wanted in checks]))
                state = Checks.STATE in checks and found.pop(0)
                settings = Checks.SETTINGS in checks and found.pop(0)
                released = client.state.checked(state=state, settings=settings) is Outcome.RELEASE
                self._ended(server, client, released=released, state=state, settings=settings)
                if not released and not client.gone:
                    self._pump(client)

            self._internal(server, text, decide)

    def _ended(
        self,
        server: ServerConnection,
        client: Client,
        *,
        released: bool,
        state: bool = False,
        settings: bool = False,
    ) -> None:
        """The client's transaction ended here: a borrower is told how (its loan's
        :data:`~._loans.DONE`), and a connection it left nothing on goes back."""
        if isinstance(client, Borrower):
            self._write(client, [_loans.done(released=released, state=state, settings=settings)])
        if released:
            self._give_back(server)

    def _loan_done(self, loan: Loan, body: bytes) -> None:
        """The owner's word on the transaction that ended on the loan: released (the
        loan ends) or pinned (the client's next transactions go over it too)."""
        try:
            released, state, settings = _loans.read_done(body)
        except MalformedError:
            self._server_gone(loan)
            return
        due, loan.done_due = loan.done_due, None
        client = loan.client
        if client is not None and due is Outcome.CHECK:
            client.state.checked(state=state, settings=settings)
        if released:
            loan.released = True
            self._give_back(loan)
        elif client is not None:
            self._pump(client)

    def _server_gone(self, server: ServerConnection | Loan) -> None:
        """Discard the server connection (broken, or its session is no one's to
        inherit); its client, if any, is told and closed."""
        if server.gone:
            return
        self._forget(server)
        with contextlib.suppress(Exception):
            server.discard()
        client, server.client = server.client, None
        if client is not None:
            client.server = None
            lost = "the server connection serving this client was lost"
            self._write(client, [_wire.error_response("FATAL", "08006", lost)])
            self._client_gone(client)
        if self._waiting and not self._stopping:
            self._pump(self._waiting[0])  # the pool may open another


def _listening(path: str) -> socket.socket:
    """A non-blocking Unix socket listening at ``path`` (0600), bound under another
    name and renamed once listening, so that a driver never finds it refusing."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    binding = f"{path}.{os.getpid()}.new"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(binding)
    listener.bind(binding)
    os.chmod(binding, 0o600)
    listener.listen(128)
    os.replace(binding, path)
    listener.setblocking(False)
    return listener


def _found(answers: list[Message], checks: int) -> list[bool]:
    """Whether each of the router's ``checks`` found state (a row whose counts sum
    above zero); a check that failed (cancelled by a ``statement_timeout`` the
    client set, say) found it, since nothing says otherwise."""
    if any(message.kind == _wire.ERROR_RESPONSE for message in answers):
        return [True] * checks
    rows = [
        sum(int(value or b"0") for value in _wire.data_row(message.body)) > 0
        for message in answers
        if message.kind == _wire.DATA_ROW
    ]
    return rows if len(rows) == checks else [True] * checks
