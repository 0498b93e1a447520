"""Transaction mode's prepared statements on one server connection, and the answers the
router writes for them.

Every client's statements reach a server connection under the names
:mod:`._statement_names` gives them. :class:`ServerStatements` keeps what the
connection has prepared (the named statements, least recently used dropped past
``max_prepared``, and what the unnamed statement holds) and turns each client
:class:`~._statement_names.Op` into what the server gets:

- a ``Parse`` of a statement already prepared here is not sent; the router answers
  its ``ParseComplete`` itself;
- a ``Bind`` or ``Describe`` of a statement not prepared here is preceded by its
  ``Parse``, whose ``ParseComplete`` the client never sees;
- a ``Close`` of a statement is not sent (other clients may use it); the router
  answers its ``CloseComplete``;
- a statement dropped from a full cache is closed first, its ``CloseComplete``
  swallowed.

The server answers the messages of the extended protocol in order, so the router
keeps, per message sent or not, what its answer is (:class:`Answer`): passed on,
swallowed, or written by the router, and which server message ends it. An
``ErrorResponse`` makes the server skip every message up to ``Sync``; the answers
of those are dropped, and the statements they would have prepared are not prepared.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Final, NamedTuple, final

from . import _wire
from ._statement_names import Op, Statement
from ._wire import Message

_PARSE_COMPLETE: Final = Message(_wire.PARSE_COMPLETE, b"")
_CLOSE_COMPLETE: Final = Message(_wire.CLOSE_COMPLETE, b"")
#: The server messages that end the answer to each client message.
_ENDS: Final = {
    _wire.PARSE: frozenset({_wire.PARSE_COMPLETE}),
    _wire.BIND: frozenset({_wire.BIND_COMPLETE}),
    _wire.DESCRIBE: frozenset({_wire.ROW_DESCRIPTION, _wire.NO_DATA}),
    _wire.EXECUTE: frozenset(
        {_wire.COMMAND_COMPLETE, _wire.EMPTY_QUERY_RESPONSE, _wire.PORTAL_SUSPENDED}
    ),
    _wire.CLOSE: frozenset({_wire.CLOSE_COMPLETE}),
    _wire.SYNC: frozenset({_wire.READY_FOR_QUERY}),
    _wire.QUERY: frozenset({_wire.READY_FOR_QUERY}),
    _wire.FUNCTION_CALL: frozenset({_wire.READY_FOR_QUERY}),
}
#: Server messages that may come at any time, outside any answer.
_ASYNCHRONOUS: Final = frozenset(
    {_wire.NOTICE_RESPONSE, _wire.PARAMETER_STATUS, _wire.NOTIFICATION_RESPONSE}
)
#: Command statuses after which the session has no prepared statement left.
_DEALLOCATING: Final = frozenset({b"DISCARD ALL", b"DEALLOCATE ALL"})
#: How many statements a server connection keeps prepared by default.
MAX_PREPARED: Final = 256


class Answer(NamedTuple):
    """The answer the server owes (or the router writes) for one client message.

    Attributes:
        kind: the client message's type byte.
        swallow: the answer is the router's own (an injected ``Parse`` or ``Close``):
            it never reaches the client.
        synthetic: the message the router writes instead of a server answer (the
            client message was not sent), or None.
        prepares: the statement whose ``Parse`` this answers, or None.
        closes: the server name of the statement whose eviction ``Close`` this
            answers, or None.
    """

    kind: int
    swallow: bool = False
    synthetic: Message | None = None
    prepares: Statement | None = None
    closes: bytes | None = None


@final
class ServerStatements:
    """The prepared statements of one server connection, and the answers owed on it.

    Args:
        max_prepared: how many named statements the connection keeps prepared; the
            least recently used is closed when another is needed.
    """

    __slots__ = ("_answers", "_max", "_named", "_skipping", "_unnamed")

    def __init__(self, max_prepared: int = MAX_PREPARED) -> None:
        self._max = max_prepared
        self._named: OrderedDict[bytes, None] = OrderedDict()
        self._unnamed: bytes | None = None
        self._answers: deque[Answer] = deque()
        self._skipping = False

    @property
    def prepared(self) -> frozenset[bytes]:
        """The server names of the named statements prepared here."""
        return frozenset(self._named)

    def send(self, op: Op) -> tuple[list[Message], list[Message]]:
        """What to send the server for a client message, and what the client gets now.

        Returns:
            The messages for the server, in order (none, when the router answers the
            message itself), and the answers the router writes to the client at once
            (a ``ParseComplete`` or ``CloseComplete`` no server answer precedes).
        """
        kind = op.message.kind
        if self._skipping and kind != _wire.SYNC:
            return [op.message], []  # the server skips it after an error: no answer
        self._skipping = False
        out: list[Message] = []
        if op.close:
            self._answers.append(Answer(kind, synthetic=_CLOSE_COMPLETE))
        elif kind == _wire.PARSE and op.statement is not None:
            if self._is_prepared(op.statement):
                self._answers.append(Answer(kind, synthetic=_PARSE_COMPLETE))
            else:
                out += self._prepare(op.statement, swallow=False, parse=op.message)
        else:
            if op.statement is not None and not self._is_prepared(op.statement):
                out += self._prepare(op.statement, swallow=True, parse=op.statement.parse())
            if kind == _wire.QUERY:
                self._unnamed = None
            out.append(op.message)
            if kind in _ENDS:
                self._answers.append(Answer(kind))
        return out, self._synthetic()

    def answer(self, message: Message) -> list[Message]:
        """What the client gets of a server message: the router's own answers owed
        before it, then the message unless it answers the router.

        Raises:
            MalformedError: a ``CommandComplete`` whose body is not well formed.
        """
        kind = message.kind
        if kind in _ASYNCHRONOUS or not self._answers:
            return [message]
        out = self._synthetic()
        if kind == _wire.ERROR_RESPONSE:
            self._failed()
            return [*out, message]
        if kind == _wire.COMMAND_COMPLETE and _wire.command_status(message.body) in _DEALLOCATING:
            self.forget_all()
        head = self._answers[0]
        if not head.swallow:
            out.append(message)
        if kind in _ENDS[head.kind]:
            self._answers.popleft()
            out += self._synthetic()
        return out

    def ran_query(self) -> None:
        """The router ran a simple ``Query`` of its own (a check, ``ROLLBACK``) on the
        connection, which drops the unnamed statement."""
        self._unnamed = None

    def forget_all(self) -> None:
        """The session's statements are gone (``DISCARD ALL``, ``DEALLOCATE ALL``)."""
        self._named.clear()
        self._unnamed = None

    def _is_prepared(self, statement: Statement) -> bool:
        if not statement.name:
            return self._unnamed == statement.digest
        if statement.name in self._named:
            self._named.move_to_end(statement.name)
            return True
        return False

    def _prepare(self, statement: Statement, *, swallow: bool, parse: Message) -> list[Message]:
        out = []
        if not statement.name:
            self._unnamed = statement.digest
        else:
            if len(self._named) >= self._max:
                oldest, _ = self._named.popitem(last=False)
                out.append(Message(_wire.CLOSE, b"S" + oldest + b"\0"))
                self._answers.append(Answer(_wire.CLOSE, swallow=True, closes=oldest))
            self._named[statement.name] = None
        out.append(parse)
        self._answers.append(Answer(_wire.PARSE, swallow=swallow, prepares=statement))
        return out

    def _failed(self) -> None:
        """An error: the server skips to ``Sync``; what it skips prepares nothing, and
        closes nothing (an evicted statement it did not close is still prepared)."""
        if self._answers[0].kind in (_wire.QUERY, _wire.FUNCTION_CALL):
            return  # a simple query's error: its ReadyForQuery follows
        while self._answers and self._answers[0].kind != _wire.SYNC:
            skipped = self._answers.popleft()
            if skipped.closes is not None:
                self._named[skipped.closes] = None
                self._named.move_to_end(skipped.closes, last=False)  # the next to go
            prepares = skipped.prepares
            if prepares is None:
                continue
            if prepares.name:
                self._named.pop(prepares.name, None)
            elif self._unnamed == prepares.digest:
                self._unnamed = None
        self._skipping = not self._answers

    def _synthetic(self) -> list[Message]:
        out = []
        while self._answers and self._answers[0].synthetic is not None:
            synthetic = self._answers.popleft().synthetic
            assert synthetic is not None
            out.append(synthetic)
        return out
