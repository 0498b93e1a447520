"""Transaction mode's renaming of one client's prepared statements.

A client prepares a statement on the server connection of one transaction and may
bind it in the next, on another connection. So the client's router keeps each
statement it saw parsed, and names it on the server by a digest of its parameter
types and text (``orb_`` and 32 hex digits): two clients that prepare the same SQL
share one statement on a server connection, and any connection can be given the
statement before it is used (:mod:`._server_statements`). The unnamed statement
stays unnamed on the server (so the server still plans it for its parameters each
time), but is remembered the same way, since a driver may parse it in one
transaction and bind it in the next.

:class:`StatementNames` turns each client message into an :class:`Op`: the message
to send, with statement names replaced, and the statement it needs prepared.
"""

from __future__ import annotations

import hashlib
from typing import Final, NamedTuple, final

from . import _wire
from ._wire import Message

#: The server name of an unnamed statement the client has not prepared (another
#: client's may be on the connection): the server answers SQLSTATE 26000
#: (``invalid_sql_statement_name``), as it would the client.
MISSING: Final = b"orb_missing"
_PREFIX: Final = b"orb_"


class Statement(NamedTuple):
    """A statement as the server will know it.

    Attributes:
        name: its name on the server: ``orb_`` and the digest, or ``b""`` (unnamed).
        digest: 32 hex digits of a BLAKE2b digest of ``types`` and ``text``.
        types: the ``Parse`` message's parameter types, as sent (``u16`` count, OIDs).
        text: the SQL text.
    """

    name: bytes
    digest: bytes
    types: bytes
    text: bytes

    def parse(self) -> Message:
        """The ``Parse`` that prepares this statement on a server connection."""
        return Message(_wire.PARSE, self.name + b"\0" + self.text + b"\0" + self.types)


class Op(NamedTuple):
    """A client message as the server connection will get it.

    Attributes:
        message: the message, statement names replaced.
        statement: the statement it parses or uses (``Parse``, ``Bind``, ``Describe``
            of a statement), which must be prepared on the connection first; else None.
        close: the message is a ``Close`` of a statement: not sent, answered by the
            router (statements live as long as their server connection's cache keeps
            them).
    """

    message: Message
    statement: Statement | None = None
    close: bool = False


def statement_of(types: bytes, text: bytes, *, named: bool) -> Statement:
    """The :class:`Statement` of a ``Parse``'s parameter types and text."""
    digest = hashlib.blake2b(types + text, digest_size=16).hexdigest().encode()
    return Statement(_PREFIX + digest if named else b"", digest, types, text)


@final
class StatementNames:
    """One client's statements, by the names the client gave them."""

    __slots__ = ("_named", "_unnamed")

    def __init__(self) -> None:
        self._named: dict[bytes, Statement] = {}
        self._unnamed: Statement | None = None

    def op(self, message: Message) -> Op:
        """The :class:`Op` of a client message.

        A ``Parse`` of a name the client already prepared replaces it (the server
        would answer SQLSTATE 42P05). A ``Bind`` or ``Describe`` of a name the client
        never parsed goes on unchanged (a statement of SQL ``PREPARE``, on the
        connection pinned to the client, or none, which the server refuses); of the
        unnamed statement it never parsed, it names :data:`MISSING`.

        Raises:
            MalformedError: a ``Parse``, ``Bind``, ``Describe`` or ``Close`` whose
                names or types are not well formed.
        """
        kind = message.kind
        if kind == _wire.PARSE:
            return self._parse(message)
        if kind == _wire.BIND:
            portal, name, rest = _wire.bind_names(message.body)
            used = self._lookup(name)
            body = portal + b"\0" + self._server_name(name, used) + b"\0" + message.body[rest:]
            return Op(Message(kind, body), used)
        if kind in (_wire.DESCRIBE, _wire.CLOSE):
            what, name = _wire.target(message.body)
            if what != ord("S"):
                return Op(message)
            if kind == _wire.CLOSE:
                self._forget(name)
                return Op(message, close=True)
            used = self._lookup(name)
            return Op(Message(kind, b"S" + self._server_name(name, used) + b"\0"), used)
        if kind == _wire.QUERY:
            self._unnamed = None  # a simple query drops the unnamed statement
        return Op(message)

    def _parse(self, message: Message) -> Op:
        name, text, types = _wire.parse_statement(message.body)
        statement = statement_of(types, text, named=bool(name))
        if name:
            self._named[name] = statement
        else:
            self._unnamed = statement
        return Op(statement.parse(), statement)

    def forget_all(self) -> None:
        """The client ran ``DISCARD ALL`` or ``DEALLOCATE ALL``: it has no statements."""
        self._named.clear()
        self._unnamed = None

    def _lookup(self, name: bytes) -> Statement | None:
        return self._named.get(name) if name else self._unnamed

    @staticmethod
    def _server_name(name: bytes, statement: Statement | None) -> bytes:
        if statement is not None:
            return statement.name
        return name or MISSING

    def _forget(self, name: bytes) -> None:
        if name:
            self._named.pop(name, None)
        else:
            self._unnamed = None
