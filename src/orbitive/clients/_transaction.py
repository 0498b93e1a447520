"""Transaction mode in one process: each key's router, the pool of its server connections,
and where a driver connects to reach it (docs/architecture.md, "Transaction mode").

The PostgreSQL adapters' pools of one key in a process share one
:class:`TransactionRouter` (:func:`attach`, :func:`detach`): a
:class:`~._client_pool.ClientPool` of server connections (psycopg, autocommit, on the
key: ``max_live`` counts them), lent to other processes' routers and borrowed from
them, and the :class:`~._router.Router` that serves the drivers' connections on them.
A driver connects to the router's Unix socket,
``/dev/shm/orbit-{fleet}-{kind}-pg-{node}-{uid}/.s.PGSQL.{port}`` (a folder 0700, a
port of the key's), with the conninfo :attr:`TransactionRouter.conninfo` gives; its
connection costs no server connection, and the adapters pool those connections
under a key of their own (:func:`clients_key`).

A forked child starts with none of its parent's routers: its first pool starts its
own (the parent's sockets stay the parent's).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar, final

import psycopg

from .._core import _fork
from .._core._errors import InvalidPoolOptions
from .._core._fleet import Fleet
from .._core._region import SHM_DIR, router_folder_name
from ..pool import Key
from ._client_pool import ClientPool
from ._options import SECONDS_MAX, PoolOptions, pool_key, printable_label
from ._psycopg_connections import CLIENT_SIDE
from ._router import Router

_T = TypeVar("_T")

#: The lowest port a router's socket is named by, and how many there are.
PORT_BASE: Final = 20000
PORT_SPAN: Final = 40000
#: How many client connections to routers a key's fleet keeps at most (they cost no
#: server connection, only a descriptor and a buffer in each router).
CLIENTS_MAX: Final = 4096


#: Connection parameters that reach the server, not the router.
#: ``asyncpg.connect``'s arguments that reach the server: the router's server
#: connections take them (``ssl`` and ``direct_tls`` are asyncpg's: a DSN's libpq
#: ``sslmode`` says it for them), the connections to the router none.
_ASYNCPG_TO_THE_SERVER: Final = (
    "host", "port", "user", "password", "passfile", "database", "ssl", "direct_tls",
)  # fmt: skip
_TO_THE_SERVER: Final = (
    "host", "hostaddr", "port", "password", "passfile", "sslmode", "gssencmode",
    "sslrootcert", "sslcert", "sslkey", "sslpassword", "target_session_attrs",
    "load_balance_hosts", "require_auth", "channel_binding",
)  # fmt: skip


def clients_key(key: Key) -> Key:
    """The key the adapters pool their connections to a router under (not ``key``,
    whose ``max_live`` counts server connections)."""
    return pool_key(f"transaction mode's clients of {key}")


def server_conninfo(params: Mapping[str, Any]) -> str:
    """The libpq conninfo of the server connections from a driver's connection keyword
    arguments (libpq's names; psycopg's own client-side ones are left out)."""
    kept = {name: value for name, value in params.items() if name not in CLIENT_SIDE}
    return psycopg.conninfo.make_conninfo("", **kept)


def asyncpg_arguments(
    dsn: str | None, kwargs: Mapping[str, Any], target: Mapping[str, Any]
) -> tuple[str, dict[str, Any]]:
    """For an asyncpg pool: the libpq conninfo of the server connections, and
    ``asyncpg.connect``'s keyword arguments for a connection to the router before
    :meth:`TransactionRouter.client_params` points them at its socket (``target``'s
    user and database named; what reaches the server left out).

    Raises:
        InvalidPoolOptions: libpq refuses the DSN (asyncpg's own query parameters,
            ``ssl=`` say, would reach the server connections: write libpq's).
    """
    server = {name: kwargs[name] for name in _ASYNCPG_TO_THE_SERVER if kwargs.get(name) is not None}
    if "database" in server:
        server["dbname"] = server.pop("database")
    server.pop("ssl", None)
    server.pop("direct_tls", None)
    try:
        conninfo = psycopg.conninfo.make_conninfo(dsn or "", **server)
    except psycopg.ProgrammingError as error:
        raise InvalidPoolOptions(
            f"mode='transaction' reads the DSN with libpq, which refuses it: {error}",
            key="dsn",
        ) from None
    routed = {name: value for name, value in kwargs.items() if name not in _ASYNCPG_TO_THE_SERVER}
    routed.update(user=target.get("user"), database=target.get("database"))
    return conninfo, {name: value for name, value in routed.items() if value is not None}


def client_options(options: PoolOptions) -> PoolOptions:
    """The options of an adapter's pool of connections to the router: ``options``'
    timeouts, and sizes no server connection limits (:data:`CLIENTS_MAX`)."""
    return dataclasses.replace(
        options, mode="session", max_live=CLIENTS_MAX, min_idle=0, max_idle=CLIENTS_MAX
    )


def clients_label(label: str) -> str:
    """How ``orbit pool`` names an adapter's pool of connections to the router."""
    return printable_label(f"{label or 'transaction mode'} (router clients)")


@final
class TransactionRouter:
    """One key's router in this process, on its pool of server connections.

    Args:
        fleet: the joined fleet.
        conninfo: the libpq conninfo of the server connections (the adapter's).
        key: the key ``max_live`` counts server connections under.
        options: the adapter's options (``mode="transaction"``).
        kind: the pool table's SHM kind.
        label: the key's label.
        port: the number the router's socket is named by.

    Raises:
        As :class:`~._client_pool.ClientPool` and :class:`~._router.Router`.
    """

    def __init__(
        self,
        fleet: Fleet,
        conninfo: str,
        key: Key,
        options: PoolOptions,
        kind: int,
        label: str,
        port: int,
    ) -> None:
        # Between transactions every server connection stays idle, for any process:
        # one given back while another process waits is lent to it (which its return
        # wakes it for), never closed for it to open its own (a turn that never ends).
        server_options = dataclasses.replace(
            options,
            mode="session",
            on_session_state="pin",
            max_idle=options.max_live,
            handoff_after=SECONDS_MAX,
            handoff_uses=None,
        )
        self.servers: ClientPool[psycopg.Connection[Any]] = ClientPool(
            fleet,
            key,
            create=functools.partial(psycopg.connect, conninfo, autocommit=True),
            close=psycopg.Connection.close,
            options=server_options,
            kind=kind,
            label=label or None,
            lends=True,
        )
        folder = str(SHM_DIR / router_folder_name(fleet.name, kind, fleet.node))
        try:
            self.router = Router(
                folder,
                port,
                self.servers,
                refuse=options.on_session_state == "refuse",
                wait_timeout=options.acquire_timeout,
            )
        except BaseException:
            self.servers.close()
            raise
        self.port = port
        #: The folder of the router's socket, ``.s.PGSQL.{port}`` (a driver's host).
        self.folder = folder
        self._generation = _fork.generation

    @property
    def inherited(self) -> bool:
        """True in a forked child: the parent's router, which serves the parent; an
        adapter's pool opens anew there (:func:`attach` starts the child's own)."""
        return self._generation != _fork.generation

    def client_conninfo(self, conninfo: str) -> str:
        """``conninfo`` (the server connections') as a driver's connection to the router
        takes it: the router's socket, no password, no TLS."""
        params = self.client_params(psycopg.conninfo.conninfo_to_dict(conninfo))
        return psycopg.conninfo.make_conninfo("", **params)

    def client_params(self, params: dict[str, Any]) -> dict[str, Any]:
        """Connection parameters (libpq's names, the server connections') as a driver's
        connection to the router takes them: the router's socket, no password, no TLS."""
        routed = {name: value for name, value in params.items() if name not in _TO_THE_SERVER}
        routed.update(host=self.folder, port=str(self.port), sslmode="disable")
        return routed

    def close(self) -> None:
        """Stop the router, then close the server connections; the socket's folder goes
        once no other router of the process has a socket in it."""
        self.router.close()  # closes the pool
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(self.router.path))


class _Routers:
    """This process's routers by (fleet, kind, key), with how many adapter pools use
    each; a forked child starts with none (the parent's are the parent's)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.found: dict[tuple[int, int, Key], tuple[TransactionRouter, int]] = {}
        _fork.register(self)

    def _after_fork_in_child(self) -> None:
        self.lock = threading.Lock()
        self.found = {}


_ROUTERS: Final = _Routers()


def attach(
    fleet: Fleet, conninfo: str, key: Key, options: PoolOptions, kind: int, label: str
) -> TransactionRouter:
    """The process's router of ``key`` (started by the first pool that asks), now used
    by one more pool: give it back with :func:`detach`.

    Raises:
        As :class:`TransactionRouter`.
    """
    with _ROUTERS.lock:
        name = (id(fleet), kind, key)
        found = _ROUTERS.found.get(name)
        if found is None:
            used = {router.port for router, _ in _ROUTERS.found.values()}
            port = PORT_BASE + int(str(key)[:8], 16) % PORT_SPAN
            while port in used:
                port = PORT_BASE + (port - PORT_BASE + 1) % PORT_SPAN
            found = (TransactionRouter(fleet, conninfo, key, options, kind, label, port), 0)
        router, users = found
        _ROUTERS.found[name] = (router, users + 1)
        return router


def detach(router: TransactionRouter) -> None:
    """One pool no longer uses ``router``: the last one closes it. A router of the
    parent process (in a forked child) is left alone."""
    with _ROUTERS.lock:
        for name, (found, users) in list(_ROUTERS.found.items()):
            if found is router:
                if users > 1:
                    _ROUTERS.found[name] = (router, users - 1)
                    return
                del _ROUTERS.found[name]
                break
        else:
            return
    router.close()


async def in_a_thread(call: Callable[[], _T], undo: Callable[[_T], object] | None = None) -> _T:
    """``call()`` in a thread of its own, awaited: a router starts (or stops) without
    blocking the loop. Cancelled or interrupted while the thread runs, the awaiting
    ends at once and ``undo`` gets what ``call`` returns, once it does (a router
    attached is given back); the thread is left to finish, never abandoned half-way.

    Raises:
        Exception: what ``call`` raised.
        asyncio.CancelledError: the awaiting task was cancelled (``undo`` then runs).
    """
    done: concurrent.futures.Future[_T] = concurrent.futures.Future()

    def run() -> None:
        try:
            done.set_result(call())
        except BaseException as error:  # handed to the awaiting task
            done.set_exception(error)

    threading.Thread(target=run, name="orbitive-router-start").start()
    waiting = asyncio.wrap_future(done)
    try:
        return await asyncio.shield(waiting)
    except BaseException:
        waiting.add_done_callback(_retrieved)  # an error it ends with is nobody's now
        if undo is not None:
            done.add_done_callback(functools.partial(_undo_once_done, undo))
        raise


def _retrieved(waiting: asyncio.Future[Any]) -> None:
    """Mark the outcome of a call no task awaits any more as seen (asyncio would log
    an exception it ended with as never retrieved)."""
    if not waiting.cancelled():
        waiting.exception()


def _undo_once_done(undo: Callable[[Any], object], done: concurrent.futures.Future[Any]) -> None:
    """Give back what a thread of :func:`in_a_thread` made for a task that no longer
    waits, in a thread of its own (this may run on the loop)."""
    if not done.cancelled() and done.exception() is None:
        threading.Thread(target=undo, args=(done.result(),), name="orbitive-router-undo").start()
