"""psycopg connections as the adapter's pools handle them.

A connection's key (what one host-wide budget counts), the checkout check,
the states a returned connection may be in, a close that waits until the
server has ended the session, so that the pool hands the budget on only when
the server no longer counts the connection, and the severing of a connection
in use whose units of a cross-host budget may lapse.
"""

from __future__ import annotations

import asyncio
import math
import os
import select
import socket
import time
from typing import Any, Final, cast

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict

from .._core._errors import InvalidPoolOptions, shown
from ..pool import Key
from ._database import TARGET_ENVIRONMENT, target_label

IDLE: Final = pq.TransactionStatus.IDLE
OPEN: Final = (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR)
#: Longest wait, in seconds, for the server to end a closed connection's session.
CLOSE_WAIT_S: Final = 2.0
#: The connection parameters a label shows (never the password).
_LABELLED: Final = frozenset({"host", "port", "dbname", "user", "service"})


#: Arguments of ``psycopg.Connection.connect`` that shape only this process's side of a
#: connection, not the server or the session: not part of the key (a row factory's
#: repr even holds an address, other in every process).
CLIENT_SIDE: Final = frozenset(
    {"autocommit", "prepare_threshold", "context", "row_factory", "cursor_factory"}
)


def connection_key(conninfo: str, kwargs: dict[str, Any]) -> Key:
    """The pool key of a connection target: conninfo and connection parameters.

    The same for :class:`ConnectionPool` and :class:`AsyncConnectionPool`, and
    whatever :data:`CLIENT_SIDE` arguments they add: one database is one budget,
    whichever API opens it (a fleet of sync and asyncio workers shares
    ``max_live``). Each pool still checks out only connections it made itself.

    Raises:
        InvalidPoolOptions: ``conninfo`` is not a str, or has a NUL or no UTF-8 form
            (a lone surrogate); ``kwargs`` is not a dict of str names, or a
            connection parameter (any name but :data:`CLIENT_SIDE`'s) is not a str
            (UTF-8, no NUL), an int of at most 64 bits, a float or None.
    """
    conninfo = _text(conninfo, "conninfo", "conninfo")
    if not isinstance(kwargs, dict):
        raise InvalidPoolOptions(f"kwargs must be a dict, got {shown(kwargs)}", key="kwargs")
    parts = []
    for name, value in kwargs.items():
        if _text(name, "a kwargs name", "kwargs") not in CLIENT_SIDE:
            parts.append((name, _parameter(name, value)))
    text = f"psycopg\0{conninfo}\0{sorted(parts)!r}"
    given = _target(conninfo, kwargs)
    environment = [
        (name, os.environ[variable])
        for name, variable in TARGET_ENVIRONMENT.items()
        if not given.get(name) and os.environ.get(variable)
    ]
    if environment:  # what libpq takes from the environment goes to another server
        text += f"\0{environment!r}"
    return Key.digest(text.encode())


def _target(conninfo: str, kwargs: dict[str, Any]) -> dict[str, object]:
    """The target parts the conninfo and the connection parameters give (``host``,
    ``port``, ``database``, ``user``, ``service``), as libpq reads them.

    Raises:
        InvalidPoolOptions: the conninfo does not parse.
    """
    given = {
        name: str.__str__(value) if issubclass(type(value), str) else str(value)
        for name, value in kwargs.items()
        if name in _LABELLED and value is not None  # checked by connection_key already
    }
    try:
        params = conninfo_to_dict(conninfo, **given)
    except psycopg.ProgrammingError as error:
        raise InvalidPoolOptions(f"conninfo does not parse: {error}", key="conninfo") from None
    return {"database" if name == "dbname" else name: params.get(name) for name in _LABELLED}


def conninfo_label(conninfo: str, kwargs: dict[str, Any]) -> str:
    """The database a pool connects to, for people: ``user@host:port/dbname``.

    Read from the conninfo and the connection parameters as libpq reads them, a
    part they leave out from libpq's environment variables (``PGHOST``,
    ``PGPORT``, ...); the password and every other parameter are left out (call
    :func:`connection_key` first: it checks the arguments). A part given nowhere
    is left out too (a missing host shows as ``localhost``: libpq's default is the
    local server's socket).

    Raises:
        InvalidPoolOptions: the conninfo does not parse.
    """
    return target_label(_target(_text(conninfo, "conninfo", "conninfo"), kwargs))


def _parameter(name: str, value: object) -> str:
    """A connection parameter's value as the key spells it.

    Raises:
        InvalidPoolOptions: not a str (UTF-8, no NUL), an int of at most 64 bits, a
            float or None.
    """
    if issubclass(type(value), str):
        return repr(_text(value, f"kwargs[{name!r}]", "kwargs"))
    if value is None or type(value) in (float, bool):
        return repr(value)
    if type(value) is int and value.bit_length() <= 64:
        return repr(value)
    raise InvalidPoolOptions(
        f"kwargs[{name!r}] is a connection parameter: a str, a 64-bit int, a float or "
        f"None, got {shown(value)}",
        key="kwargs",
    )


def _text(value: object, what: str, key: str) -> str:
    """``value`` as the exact text libpq gets (a str subclass's own methods not called).

    Raises:
        InvalidPoolOptions: not a str, a NUL, or no UTF-8 form (a lone surrogate),
            naming ``what``; its ``key`` is ``key``.
    """
    if not issubclass(type(value), str):  # type(), not isinstance: __class__ may lie
        raise InvalidPoolOptions(f"{what} must be a str, got {shown(value)}", key=key)
    text = str.__str__(cast(str, value))
    if "\x00" in text:
        raise InvalidPoolOptions(f"{what} has a NUL character", key=key)
    try:
        text.encode()
    except UnicodeEncodeError:
        raise InvalidPoolOptions(f"{what} has no UTF-8 form (a lone surrogate)", key=key) from None
    return text


def check_connection(conn: psycopg.Connection[Any]) -> None:
    """psycopg_pool's check: an empty query outside any transaction; raises if broken."""
    if conn.autocommit:
        conn.execute("")
        return
    conn.autocommit = True
    try:
        conn.execute("")
    finally:
        conn.autocommit = False


async def check_connection_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """Asyncio twin of :func:`check_connection`."""
    if conn.autocommit:
        await conn.execute("")
        return
    await conn.set_autocommit(True)
    try:
        await conn.execute("")
    finally:
        await conn.set_autocommit(False)


def status(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> int:
    """The libpq transaction status as an int (``conn.info`` builds an enum per read)."""
    return conn.pgconn.transaction_status


def returnable(status: int) -> bool:
    """False for a connection in an unknown state (discard it): a query still running,
    a broken socket, or closed (``UNKNOWN``)."""
    return status in (IDLE, *OPEN)


def sever_connection(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Shut a connection's socket down, from any thread, while its owner may be using it.

    A statement running on it fails at once (psycopg raises ``OperationalError``),
    the server sees the session end, and the pool discards the connection when it
    is handed back. The connection itself is not closed here: only the thread that
    uses it may free libpq's state.
    """
    try:
        fd = os.dup(conn.pgconn.socket)
    except (OSError, psycopg.Error):
        return
    sock = socket.socket(fileno=fd)
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # not connected any more: nothing to sever
        pass
    finally:
        sock.close()  # the duplicate only


def watch_socket(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> int:
    """A duplicate of the connection's socket, to see the server end it; -1 if none."""
    try:
        return os.dup(conn.pgconn.socket)
    except (OSError, psycopg.Error):
        return -1


def await_gone(fd: int) -> None:
    """Wait (at most :data:`CLOSE_WAIT_S`) until the server closed its end, then close ``fd``.

    A backend leaves ``pg_stat_activity`` before it closes its socket, so once
    this returns the server no longer counts the connection: only then does
    the pool hand its budget to another process. The wait is a ``poll``, which
    takes any descriptor number (``select`` refuses 1024 and above, which a
    busy process's sockets get).
    """
    if fd < 0:
        return
    try:
        watch = select.poll()
        watch.register(fd, select.POLLIN)
        deadline = time.monotonic() + CLOSE_WAIT_S
        while (remaining := deadline - time.monotonic()) > 0:
            if not watch.poll(math.ceil(remaining * 1000.0)) or not os.read(fd, 65536):
                return
    except OSError:  # reset by the server: gone as well
        return
    finally:
        os.close(fd)


def close(conn: psycopg.Connection[Any]) -> None:
    """Close ``conn``, then wait (at most :data:`CLOSE_WAIT_S`) until the server ended it."""
    conn._pool = None  # closed for good, even with close_returns
    fd = watch_socket(conn)
    try:
        conn.close()
    finally:
        await_gone(fd)


async def close_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """Asyncio twin of :func:`close` (the wait runs in a worker thread)."""
    conn._pool = None  # closed for good, even with close_returns
    fd = watch_socket(conn)
    try:
        await conn.close()
    finally:
        await asyncio.to_thread(await_gone, fd)
