"""The PostgreSQL protocol (version 3.0) as transaction mode reads it: frames, not SQL.

After the startup, every message in either direction is framed the same way: a type
byte, a ``u32`` big-endian length that counts itself but not the type byte, and the
body. Transaction mode's routers (docs/architecture.md, "Transaction mode: the plan")
pass messages on whole and read only a few fields: the status byte of
``ReadyForQuery``, the command status of ``CommandComplete``, the SQLSTATE of
``ErrorResponse``, ``ParameterStatus`` pairs, and the statement names of ``Parse``,
``Bind``, ``Describe`` and ``Close``.

:class:`Framer` splits a byte stream into messages and checks each frame before
its body is buffered: the type byte against the set its direction allows, the
length at least 4 and at most :data:`MESSAGE_MAX`. The functions below it read one
field of a body, each raising :class:`~orbitive.MalformedError` on a body that is
too short or lacks a terminator, and build the few messages a router writes
itself. Nothing here does I/O.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple, final

from .._core._errors import MalformedError, SessionClosed

#: Largest body of a client's message, in bytes: PostgreSQL's own limit
#: (``PQ_LARGE_MESSAGE_LIMIT``, ``MaxAllocSize - 1``), so that nothing the server
#: would take is refused on the way.
MESSAGE_MAX: Final = 0x3FFF_FFFE
#: Largest body of a server's message, in bytes: what its signed 32-bit length allows.
BACKEND_MESSAGE_MAX: Final = 0x7FFF_FFFF - 4
HEADER: Final = struct.Struct("!BI")
_U16: Final = struct.Struct("!H")
_I32: Final = struct.Struct("!i")

# What a client (a driver) sends after the startup.
QUERY: Final = ord("Q")
PARSE: Final = ord("P")
BIND: Final = ord("B")
DESCRIBE: Final = ord("D")
EXECUTE: Final = ord("E")
CLOSE: Final = ord("C")
FLUSH: Final = ord("H")
SYNC: Final = ord("S")
COPY_DATA: Final = ord("d")
COPY_DONE: Final = ord("c")
COPY_FAIL: Final = ord("f")
TERMINATE: Final = ord("X")
FUNCTION_CALL: Final = ord("F")

# What the server answers after the startup.
PARAMETER_STATUS: Final = ord("S")
READY_FOR_QUERY: Final = ord("Z")
ROW_DESCRIPTION: Final = ord("T")
DATA_ROW: Final = ord("D")
COMMAND_COMPLETE: Final = ord("C")
EMPTY_QUERY_RESPONSE: Final = ord("I")
ERROR_RESPONSE: Final = ord("E")
NOTICE_RESPONSE: Final = ord("N")
PARSE_COMPLETE: Final = ord("1")
BIND_COMPLETE: Final = ord("2")
CLOSE_COMPLETE: Final = ord("3")
PARAMETER_DESCRIPTION: Final = ord("t")
NO_DATA: Final = ord("n")
PORTAL_SUSPENDED: Final = ord("s")
COPY_IN_RESPONSE: Final = ord("G")
COPY_OUT_RESPONSE: Final = ord("H")
NOTIFICATION_RESPONSE: Final = ord("A")
FUNCTION_CALL_RESPONSE: Final = ord("V")

#: Every type a client may send once its connection is started (``FunctionCall``, the
#: fast-path interface libpq's large-object functions use, included: it runs as a
#: simple query does). ``PasswordMessage`` is not among them: after the startup it
#: is a broken stream.
FRONTEND: Final = frozenset(
    {QUERY, PARSE, BIND, DESCRIBE, EXECUTE, CLOSE, FLUSH, SYNC}
    | {COPY_DATA, COPY_DONE, COPY_FAIL, TERMINATE, FUNCTION_CALL}
)
#: Every type a server sends once a connection is started, but ``CopyBothResponse``
#: (replication only) and the startup's own (authentication, ``BackendKeyData``,
#: ``NegotiateProtocolVersion``).
BACKEND: Final = frozenset(
    {PARAMETER_STATUS, READY_FOR_QUERY, ROW_DESCRIPTION, DATA_ROW, COMMAND_COMPLETE}
    | {EMPTY_QUERY_RESPONSE, ERROR_RESPONSE, NOTICE_RESPONSE, PARSE_COMPLETE}
    | {BIND_COMPLETE, CLOSE_COMPLETE, PARAMETER_DESCRIPTION, NO_DATA, PORTAL_SUSPENDED}
    | {COPY_IN_RESPONSE, COPY_OUT_RESPONSE, COPY_DATA, COPY_DONE, NOTIFICATION_RESPONSE}
    | {FUNCTION_CALL_RESPONSE}
)
#: ``ReadyForQuery`` status bytes: idle, in a transaction block, in a failed block.
IDLE: Final = ord("I")
IN_BLOCK: Final = ord("T")
FAILED_BLOCK: Final = ord("E")
_STATUSES: Final = frozenset({IDLE, IN_BLOCK, FAILED_BLOCK})


class Message(NamedTuple):
    """One message: its type byte (an ``int``) and its body (the bytes after the length)."""

    kind: int
    body: bytes

    def frame(self) -> bytes:
        """The message as it travels: type byte, length, body."""
        return frame(self.kind, self.body)


@final
class Framer:
    """Splits one direction of a stream into :class:`Message` objects.

    Args:
        allowed: the type bytes this direction may carry (:data:`FRONTEND`,
            :data:`BACKEND`, or a set of the caller's).
        limit: the largest body accepted, in bytes; :data:`MESSAGE_MAX` by default.

    A frame is checked as soon as its five header bytes arrived, before its body is
    buffered, so a hostile length costs nothing. After a :class:`MalformedError` the
    stream cannot be resynchronised; the framer refuses further bytes.
    """

    __slots__ = ("_allowed", "_broken", "_buffer", "_limit")

    def __init__(self, allowed: frozenset[int], limit: int = MESSAGE_MAX) -> None:
        self._allowed = allowed
        self._limit = limit
        self._buffer = bytearray()
        self._broken = False

    def feed(self, data: bytes) -> list[Message]:
        """Add bytes read from the stream; return the messages they completed, in order.

        Args:
            data: the next bytes of the stream, of any length (empty included).

        Returns:
            The complete messages, oldest first; bytes of an unfinished message stay
            buffered for the next call.

        Raises:
            MalformedError: a type byte outside ``allowed``, a length under 4 or over
                ``limit`` plus 4, or a framer that raised before.
        """
        if self._broken:
            raise MalformedError("the stream broke at an earlier message")
        self._buffer += data
        messages: list[Message] = []
        start = 0
        while len(self._buffer) - start >= HEADER.size:
            kind, length = HEADER.unpack_from(self._buffer, start)
            self._check(kind, length)
            end = start + 1 + length
            if len(self._buffer) < end:
                break
            messages.append(Message(kind, bytes(self._buffer[start + HEADER.size : end])))
            start = end
        del self._buffer[:start]
        return messages

    @property
    def pending(self) -> int:
        """Bytes of an unfinished message, buffered."""
        return len(self._buffer)

    def end(self) -> None:
        """The stream ended here.

        Raises:
            SessionClosed: it ended inside a message (some bytes are buffered).
        """
        if self._buffer:
            raise SessionClosed(f"the stream ended inside a message ({len(self._buffer)} bytes)")

    def _check(self, kind: int, length: int) -> None:
        if kind not in self._allowed:
            self._broken = True
            raise MalformedError(f"message type {kind:#04x} is not allowed here")
        if not 4 <= length <= self._limit + 4:
            self._broken = True
            raise MalformedError(
                f"message length {length} is outside 4 to {self._limit + 4} (type {chr(kind)!r})"
            )


def frame(kind: int, body: bytes) -> bytes:
    """One message framed: ``kind`` (a type byte), ``len(body) + 4`` big-endian, ``body``."""
    return HEADER.pack(kind, len(body) + 4) + body


def cstring(body: bytes, start: int) -> tuple[bytes, int]:
    """The NUL-terminated string at ``start`` and the offset after its NUL.

    Raises:
        MalformedError: no NUL from ``start`` to the end of ``body``.
    """
    end = body.find(b"\0", start)
    if end < 0:
        raise MalformedError("a string field has no terminator")
    return body[start:end], end + 1


def ready_status(body: bytes) -> int:
    """The status byte of a ``ReadyForQuery``: :data:`IDLE`, :data:`IN_BLOCK` or
    :data:`FAILED_BLOCK`.

    Raises:
        MalformedError: a body that is not one of those three bytes.
    """
    if len(body) != 1 or body[0] not in _STATUSES:
        raise MalformedError(f"ReadyForQuery carries {body!r}, not one of I, T, E")
    return body[0]


def command_status(body: bytes) -> bytes:
    """The command status of a ``CommandComplete`` (``b"SELECT 3"``, ``b"SET"``).

    Raises:
        MalformedError: a body that is not one NUL-terminated string.
    """
    tag, end = cstring(body, 0)
    if end != len(body):
        raise MalformedError("CommandComplete has bytes after its command status")
    return tag


def command_name(status: bytes) -> bytes:
    """The command of a command status, without its counts: ``b"SELECT"`` of
    ``b"SELECT 3"``, ``b"DECLARE CURSOR"`` of itself."""
    return status.rstrip(b"0123456789 ")


def parameter_status(body: bytes) -> tuple[bytes, bytes]:
    """The name and value of a ``ParameterStatus``.

    Raises:
        MalformedError: a body that is not two NUL-terminated strings.
    """
    name, end = cstring(body, 0)
    value, end = cstring(body, end)
    if end != len(body) or not name:
        raise MalformedError("ParameterStatus is not a name and a value")
    return name, value


def error_fields(body: bytes) -> dict[str, bytes]:
    """The fields of an ``ErrorResponse`` or ``NoticeResponse``, by code letter
    (``"C"``: the SQLSTATE, ``"M"``: the message, ``"S"``: the severity...).

    Raises:
        MalformedError: a field without a terminator, or no final NUL.
    """
    fields: dict[str, bytes] = {}
    start = 0
    while start < len(body) and body[start]:
        code = chr(body[start])
        fields[code], start = cstring(body, start + 1)
    if start != len(body) - 1:
        raise MalformedError("an error or notice does not end with its terminator")
    return fields


def parse_statement(body: bytes) -> tuple[bytes, bytes, bytes]:
    """The statement name, the SQL text and the parameter types (``u16`` count and
    ``u32`` OIDs, as sent) of a ``Parse``.

    Raises:
        MalformedError: missing terminators, or a type list that is not as long as
            its count says.
    """
    name, end = cstring(body, 0)
    text, end = cstring(body, end)
    if len(body) < end + _U16.size:
        raise MalformedError("Parse has no parameter type count")
    (count,) = _U16.unpack_from(body, end)
    if len(body) != end + _U16.size + 4 * count:
        raise MalformedError(f"Parse names {count} parameter types in {len(body) - end - 2} bytes")
    return name, text, body[end:]


def data_row(body: bytes) -> list[bytes | None]:
    """The values of a ``DataRow``, as sent (``None`` for NULL).

    Raises:
        MalformedError: a count or a length that runs past the body, or bytes after
            the last value.
    """
    if len(body) < _U16.size:
        raise MalformedError("a DataRow has no column count")
    (count,) = _U16.unpack_from(body)
    values: list[bytes | None] = []
    offset = _U16.size
    for _ in range(count):
        if len(body) < offset + _I32.size:
            raise MalformedError("a DataRow ends inside a length")
        (size,) = _I32.unpack_from(body, offset)
        offset += _I32.size
        if size < 0:
            values.append(None)
            continue
        if len(body) < offset + size:
            raise MalformedError("a DataRow ends inside a value")
        values.append(body[offset : offset + size])
        offset += size
    if offset != len(body):
        raise MalformedError("a DataRow has bytes after its last value")
    return values


def bind_names(body: bytes) -> tuple[bytes, bytes, int]:
    """The portal and statement names of a ``Bind``, and the offset of the rest.

    Raises:
        MalformedError: a name without a terminator.
    """
    portal, end = cstring(body, 0)
    statement, end = cstring(body, end)
    return portal, statement, end


def target(body: bytes) -> tuple[int, bytes]:
    """What a ``Describe`` or ``Close`` names: ``b"S"`` (a statement) or ``b"P"`` (a
    portal) as an ``int``, and the name.

    Raises:
        MalformedError: another letter, or a name without its terminator or with
            bytes after it.
    """
    if not body or body[0] not in b"SP":
        raise MalformedError("Describe or Close names neither a statement nor a portal")
    name, end = cstring(body, 1)
    if end != len(body):
        raise MalformedError("Describe or Close has bytes after its name")
    return body[0], name


def error_response(severity: str, sqlstate: str, message: str) -> Message:
    """An ``ErrorResponse`` with its severity (``"ERROR"``, ``"FATAL"``), SQLSTATE (five
    characters) and message."""
    fields = b"".join(
        code + value.encode() + b"\0"
        for code, value in ((b"S", severity), (b"V", severity), (b"C", sqlstate), (b"M", message))
    )
    return Message(ERROR_RESPONSE, fields + b"\0")


def ready_for_query(status: int) -> Message:
    """A ``ReadyForQuery`` with status :data:`IDLE`, :data:`IN_BLOCK` or :data:`FAILED_BLOCK`."""
    return Message(READY_FOR_QUERY, bytes((status,)))


def query(text: bytes) -> Message:
    """A simple-protocol ``Query`` of ``text`` (given without its terminator)."""
    return Message(QUERY, text + b"\0")
