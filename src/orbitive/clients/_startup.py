"""The start of a client connection to transaction mode's router, answered by the router.

A driver connects to its process's router as it would to PostgreSQL, on a Unix
socket (``.s.PGSQL.{port}`` in the router's folder), and the router answers the
startup itself: no server connection is taken until the client's first
transaction. The first packet has no type byte: ``u32`` length, ``u32`` code, body.
:func:`read_first_packet` reads one of:

- an ``SSLRequest`` or ``GSSENCRequest``: the router answers ``N`` (the socket is
  local and owner-only; encryption is the server connection's business) and the
  client sends its startup next;
- a ``CancelRequest`` (:class:`Cancel`): the process and secret key the router gave
  the client, naming the statement to cancel;
- a ``StartupMessage`` of protocol 3.0 (:class:`Startup`): its parameters.

:func:`refusal` checks the parameters against the key the router serves (the role,
the database; settings other than the tracked ones must be the key's), and
:func:`startup_answer` writes what the server would: ``AuthenticationOk``, the
server's ``ParameterStatus``, a ``BackendKeyData`` of the router's own, and
``ReadyForQuery``.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Final, NamedTuple

from .._core._errors import MalformedError
from . import _wire
from ._wire import Message

PROTOCOL_3: Final = 3 << 16
SSL_REQUEST: Final = 80877103
GSSENC_REQUEST: Final = 80877104
CANCEL_REQUEST: Final = 80877102
#: The longest first packet accepted, in bytes (the server's own limit).
FIRST_PACKET_MAX: Final = 10000
_HEAD: Final = struct.Struct("!II")
_KEY: Final = struct.Struct("!ii")
_AUTHENTICATION: Final = ord("R")
_BACKEND_KEY_DATA: Final = ord("K")
#: Startup parameters the router reads itself; any other must equal the key's.
_OWN: Final = frozenset({b"user", b"database"})
#: The parameters a server reports at its startup (``GUC_REPORT``), which the router
#: reads from libpq (``PQparameterStatus``) and reports to its clients in turn.
REPORTED: Final = (
    b"server_version",
    b"server_encoding",
    b"client_encoding",
    b"application_name",
    b"default_transaction_read_only",
    b"in_hot_standby",
    b"is_superuser",
    b"session_authorization",
    b"DateStyle",
    b"IntervalStyle",
    b"TimeZone",
    b"integer_datetimes",
    b"standard_conforming_strings",
    b"scram_iterations",
    b"search_path",
)


class Startup(NamedTuple):
    """A ``StartupMessage``: its parameters, by name, as sent."""

    parameters: dict[bytes, bytes]


class Cancel(NamedTuple):
    """A ``CancelRequest``: the process number and secret key the router gave out."""

    process: int
    secret: int


class EncryptionRequest(NamedTuple):
    """An ``SSLRequest`` or ``GSSENCRequest``: answered ``N`` (:data:`NO_ENCRYPTION`)."""

    code: int


#: The answer to an :class:`EncryptionRequest`: a single byte, not a message.
NO_ENCRYPTION: Final = b"N"


def read_first_packet(data: bytes) -> tuple[Startup | Cancel | EncryptionRequest, int] | None:
    """Read the untyped first packet at the start of ``data``.

    Returns:
        The packet and how many bytes it took, or ``None`` while it has not all
        arrived.

    Raises:
        MalformedError: a length under 8 or over :data:`FIRST_PACKET_MAX`, an unknown
            code or protocol version, or a body that is not what its code says.
    """
    if len(data) < _HEAD.size:
        return None
    length, code = _HEAD.unpack_from(data)
    if not _HEAD.size <= length <= FIRST_PACKET_MAX:
        raise MalformedError(f"a first packet of {length} bytes")
    if len(data) < length:
        return None
    body = data[_HEAD.size : length]
    if code in (SSL_REQUEST, GSSENC_REQUEST):
        if body:
            raise MalformedError("an encryption request has a body")
        return EncryptionRequest(code), length
    if code == CANCEL_REQUEST:
        if len(body) != _KEY.size:
            raise MalformedError("a cancel request is not a process and a key")
        return Cancel(*_KEY.unpack(body)), length
    if code != PROTOCOL_3:
        raise MalformedError(f"protocol {code >> 16}.{code & 0xFFFF} (the router speaks 3.0)")
    return Startup(_parameters(body)), length


def _parameters(body: bytes) -> dict[bytes, bytes]:
    parameters: dict[bytes, bytes] = {}
    start = 0
    while start < len(body) and body[start]:
        name, start = _wire.cstring(body, start)
        value, start = _wire.cstring(body, start)
        parameters[name] = value
    if start != len(body) - 1:
        raise MalformedError("a startup message does not end with its terminator")
    return parameters


def refusal(
    startup: Startup,
    *,
    user: str,
    database: str,
    fixed: Mapping[bytes, bytes],
    tracked: frozenset[bytes],
) -> str | None:
    """Why the router refuses this client's startup, or ``None`` when it serves it.

    Args:
        startup: the client's startup.
        user: the role of the key's server connections.
        database: their database.
        fixed: the other startup parameters the key's server connections were opened
            with: a client's must be absent or equal (an empty ``options`` is absent).
        tracked: parameters a client may set to any value (the router sets them on
            every connection the client gets), matched without regard to case as
            the server matches setting names.
    """
    parameters = startup.parameters
    lowered = {name.lower() for name in tracked}
    if parameters.get(b"user") != user.encode():
        return f"this router serves role {user!r} only"
    if parameters.get(b"database", parameters.get(b"user")) != database.encode():
        return f"this router serves database {database!r} only"
    for name, value in parameters.items():
        if name in _OWN or name.lower() in lowered or fixed.get(name) == value:
            continue
        if name == b"options" and not value:
            continue
        shown = name.decode(errors="replace")
        return (
            f"startup parameter {shown!r} is {value.decode(errors='replace')!r} where the"
            f" pool's connections have {fixed.get(name, b'none').decode(errors='replace')!r}"
        )
    return None


def tracked_settings(startup: Startup, tracked: frozenset[bytes]) -> dict[bytes, bytes]:
    """The tracked settings a client's startup asks for, by their names in ``tracked``
    (``application_name`` from psycopg, ``TimeZone`` from asyncpg's
    ``server_settings``, whatever their case)."""
    names = {name.lower(): name for name in tracked}
    return {
        names[name.lower()]: value
        for name, value in startup.parameters.items()
        if name.lower() in names
    }


def startup_answer(server_parameters: Mapping[bytes, bytes], cancel: Cancel) -> bytes:
    """What the router answers an accepted startup, framed: ``AuthenticationOk``, one
    ``ParameterStatus`` per server parameter, ``BackendKeyData`` with the router's
    process number and secret for this client, ``ReadyForQuery`` (idle)."""
    messages = [Message(_AUTHENTICATION, b"\0\0\0\0")]
    messages += [
        Message(_wire.PARAMETER_STATUS, name + b"\0" + value + b"\0")
        for name, value in server_parameters.items()
    ]
    messages += [Message(_BACKEND_KEY_DATA, _KEY.pack(*cancel)), _wire.ready_for_query(_wire.IDLE)]
    return b"".join(message.frame() for message in messages)


def fatal(sqlstate: str, message: str) -> bytes:
    """A framed ``ErrorResponse`` of severity ``FATAL``: the last thing a refused or
    broken client connection gets."""
    return _wire.error_response("FATAL", sqlstate, message).frame()
