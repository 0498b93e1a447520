"""ClientPool: a client pool whose limits hold across every process of a fleet.

Each process keeps its own clients (a client is only ever used by the process
that created it, so session state, prepared statements, ``LISTEN`` and advisory
locks keep working) and the fleet's pool table counts them all under one key:

* a created client is registered with one unit active (never visible as idle);
* checkout takes one of this process's idle clients (:func:`take`), or claims
  creation under ``max_live`` host-wide, or waits, counted as a waiter in the
  table;
* return decides in one table step whether the client stays idle (fleet-wide
  idle below ``max_idle``, nobody elsewhere stranded at ``max_live``) or is
  retired (:func:`give_back`);
* an upkeep thread per pool (:mod:`._upkeep`) retires idle clients that a
  waiter elsewhere needs, enforces ``idle_timeout`` and ``max_lifetime``,
  refills the ``min_idle`` floor and reports dead members, so their clients
  and claims come back without a supervisor.

The decisions (:meth:`ClientPool._step`) do no I/O of the user's; the sync and
asyncio checkouts are thin drivers that call ``create``/``check``/``reset`` and
wait on the key's version word.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Final, Generic, TypeVar, final

from .._core import _fork
from .._core._errors import (
    BusyError,
    ClientCreateError,
    CreationBudgetError,
    DrainingError,
    FleetError,
    InvalidPoolOptions,
    NotOwnerError,
    OrbitError,
    PoolClosed,
    StaleError,
    UnknownClient,
)
from .._core._fleet import Fleet
from ..pool import POOL_KIND, CreationPermit, Pool
from ..pool._availability import claim_in_turn
from ..pool._table import Table
from ._async import hand_over, retire
from ._callbacks import call_async, call_sync, check_callable, run_anywhere
from ._checkout import checkout, checkout_async, take_idle_sorting
from ._entry import Entry
from ._options import PoolOptions, pool_key, seconds
from ._remote import AsyncServer, Server, request, request_async, serve_async, start_server
from ._retiring import Retirer
from ._stats import ClientPoolStatistics, Counters, collect
from ._upkeep import Upkeep

C = TypeVar("C")

#: How often the upkeep thread runs when nothing wakes it (death scans, timeouts).
UPKEEP_INTERVAL_S: Final = 0.2


@final
class ClientPool(Generic[C]):
    """A pool of clients (connections) capped host-wide across a fleet's processes.

    Args:
        fleet: the joined fleet (each worker process joins its own node).
        key: what makes clients interchangeable: a :class:`~orbitive.pool.Key`,
            or bytes or a str that is digested (a connection URL plus anything
            that forbids reuse across contexts).
        create: makes a new client; a coroutine function (or a callable that
            returns an awaitable) only for :meth:`client_async`.
        close: closes a client (its errors are swallowed and counted).
        check: called on checkout; returning False or raising discards the
            client and checks out another.
        reset: called on return; raising discards the client.
        handler: remote mode, for request/response protocols:
            ``handler(client, request: bytes) -> bytes`` (or a coroutine
            function) serves :meth:`request` on any process's idle client;
            this process then serves other processes' requests on its own.
        options: the :class:`PoolOptions` (defaults if None).
        kind: the pool table's SHM kind number.

    Raises:
        InvalidPoolOptions: a bad key, callable or options object.
        MalformedError, FleetError, LayoutMismatch, AccessDenied: as
            :class:`~orbitive.pool.Pool`.

    Example::

        pool = ClientPool(fleet, "postgresql://db/app", create=connect,
                          close=lambda conn: conn.close(),
                          options=PoolOptions(max_live=4, max_idle=2))
        with pool.client() as conn:
            conn.execute("SELECT 1")
    """

    def __init__(
        self,
        fleet: Fleet,
        key: object,
        create: Callable[[], Any],
        close: Callable[[C], Any],
        *,
        check: Callable[[C], Any] | None = None,
        reset: Callable[[C], Any] | None = None,
        handler: Callable[[C, bytes], Any] | None = None,
        options: PoolOptions | None = None,
        kind: int = POOL_KIND,
    ) -> None:
        self._closed = True  # until fully built
        self._server: Server | AsyncServer | None = None
        check_callable("create", create, optional=False)
        check_callable("close", close, optional=False)
        check_callable("check", check, optional=True)
        check_callable("reset", reset, optional=True)
        check_callable("handler", handler, optional=True)
        if options is None:
            options = PoolOptions()
        elif type(options) is not PoolOptions:
            raise _bad_options(options)
        self.key = pool_key(key)
        self.options = options
        # The options the fast paths read, as plain attributes.
        self._max_live, self._idle_limit = options.max_live, options.idle_limit
        self._max_lifetime, self._turn = options.max_lifetime, options.handoff_after
        self._turn_uses = options.handoff_uses or 1 << 64  # None: no bound by count
        self._create, self._close, self._check, self._reset = create, close, check, reset
        self._handler = handler
        self._borrowers = handler is not None  # remote mode: borrowers may reserve idle units
        self._fleet = fleet
        self._pool = Pool(fleet, kind=kind)
        self.counters = Counters()
        self._closed = False
        self._start_local()

    def _start_local(self) -> None:
        """This process's state: empty lists, a fresh lock, the table steps, the upkeep thread."""
        self._bind_steps()
        self._lock = threading.Lock()
        self._idle: list[Entry[C]] = []  # most recently returned last
        self._out: dict[int, Entry[C]] = {}  # by id(client)
        self._waiters = 0
        self._handed_over = False  # the last return closed its client (_checkout.polite)
        self._tasks: set[asyncio.Task[None]] = set()
        self._fork = _fork.generation
        self._upkeep = Upkeep(self, UPKEEP_INTERVAL_S)
        self._retirer = Retirer(self)
        self._server = start_server(self)

    def _bind_steps(self) -> None:
        """The owner's take and give-back steps: one C call each where built, else Python.

        Bound per process life (``_start_local``): the C operations belong to the
        Pool's table in this process, and decline to the Python ones in a child.
        """
        pool = self._pool
        pool._t()  # a forked child's Pool revives here and builds its own operations
        operations = pool._operations
        self._take_unit = pool._take if operations is None else operations.take
        self._give_back_unit = pool._give_back if operations is None else operations.give_back

    def _local(self) -> None:
        """Raise PoolClosed when closed; in a forked child, forget the parent's clients."""
        if self._closed:
            raise PoolClosed(f"client pool of key {self.key} is closed", key=self.key)
        if self._fork != _fork.generation:
            # The parent's clients (and its socket) are the parent's: never touch them here.
            self._server = None
            self._start_local()

    # -- remote mode ------------------------------------------------------------------

    def request(self, payload: bytes, timeout: float | None = None) -> bytes:
        """Run ``handler(client, payload)`` on an idle client of any process (remote mode).

        In order: an idle client of ours; another process's idle client (the
        lease and the payload travel to its owner over a Unix socket, and the
        owner replies); a new client within ``max_live``; else wait.

        Args:
            payload: the request, bytes (at most 64 MiB).
            timeout: seconds to wait at most; None: ``acquire_timeout``.

        Returns:
            The handler's reply, bytes.

        Raises:
            InvalidPoolOptions: no handler was given, or a bad payload or timeout.
            RemoteRequestError: the owner's handler raised (a local handler's
                error propagates as it is).
            PoolTimeout, PoolClosed, TooManyRequests, ClientCreateError, InvalidPoolOptions:
                as :meth:`getconn`.
        """
        self.serving  # noqa: B018 - raises without a handler
        return request(self, payload, timeout)

    async def request_async(self, payload: bytes, timeout: float | None = None) -> bytes:
        """Asyncio twin of :meth:`request`.

        Raises:
            RemoteRequestError, PoolTimeout, PoolClosed, TooManyRequests, ClientCreateError:
                as :meth:`request`.
        """
        self.serving  # noqa: B018 - raises without a handler
        return await request_async(self, payload, timeout)

    @property
    def serving(self) -> Callable[[C, bytes], Any]:
        """The remote-mode handler.

        Raises:
            InvalidPoolOptions: the pool was built without ``handler=``.
        """
        if self._handler is None:
            raise InvalidPoolOptions(
                "request() needs a ClientPool built with handler=", key="handler"
            )
        return self._handler

    @property
    def table(self) -> Table:
        """The pool table this process uses (for the upkeep thread and statistics)."""
        return self._pool._t()

    @property
    def pool(self) -> Pool:
        """The underlying :class:`~orbitive.pool.Pool` handle."""
        return self._pool

    # -- the decision -----------------------------------------------------------------

    def _step(self, polite: bool = False) -> Entry[C] | CreationPermit | None:
        """Take an idle client of ours, or claim creation, or None: at ``max_live``.

        ``polite``: no claim this time (see :func:`._checkout.polite`).
        """
        entry = self._take_idle()
        if entry is not None or polite:
            return entry
        return self._claim()

    def _take_idle(self) -> Entry[C] | None:
        """One of this process's idle clients, now in use (newest first), or None."""
        with self._lock:
            if not self._idle:
                return None
            entry = self._idle.pop()
            try:
                self._take_unit(entry.rid)
            except (BusyError, StaleError, NotOwnerError, DrainingError):
                self._idle.append(entry)  # the careful loop sorts it out
            else:
                self._out[id(entry.client)] = entry
                entry.uses += 1
                return entry
        return take_idle_sorting(self)

    def _claim(self) -> CreationPermit | None:
        """A creation claim under ``max_live``, fleet-wide, oldest waiting process first.

        None when at the bound or another process waited longer
        (:func:`~orbitive.pool._availability.claim_in_turn`).
        """
        table = self.table
        try:
            return CreationPermit(table, self.key, claim_in_turn(table, self.key, self._max_live))
        except CreationBudgetError:
            return None

    def _registered(self, permit: CreationPermit, client: C) -> Entry[C]:
        """Register a created client as in use (one active unit); the permit ends after."""
        with permit:
            try:
                rid = self.table.register(self.key, 1, 1)
            except BaseException:
                self._close_quietly(client)
                raise
        entry = Entry(client, rid, time.monotonic(), uses=1)
        with self._lock:
            self._out[id(client)] = entry
        self.counters.created += 1
        return entry

    def _in_turn(self, entry: Entry[C], now: float) -> bool:
        """Whether ``entry`` may still serve this process while another waits (its turn:
        ``handoff_after``, and ``handoff_uses`` when set)."""
        return now - entry.created_at < self._turn and entry.uses % self._turn_uses != 0

    def _expired(self, entry: Entry[C], now: float) -> bool:
        return now - entry.created_at >= self._max_lifetime

    # -- sync checkout ----------------------------------------------------------------

    def getconn(self, timeout: float | None = None) -> C:
        """Check a client out; hand it back with :meth:`putconn`.

        Args:
            timeout: seconds to wait at most (float > 0); None: ``acquire_timeout``.

        Returns:
            One of this process's idle clients (checked with ``check``), or a
            new one from ``create()``.

        Raises:
            PoolTimeout: none within the timeout.
            PoolClosed: the pool is closed.
            TooManyRequests: ``max_waiting`` callers of this process already wait.
            ClientCreateError: ``create()`` raised (the claim is returned).
            InvalidPoolOptions: a bad timeout, or ``create`` returned an awaitable.
        """
        self.counters.requests += 1
        if timeout is not None:
            seconds("timeout", timeout)
        if self._fork == _fork.generation and not self._closed:  # the idle fast path
            entry = self._take_idle()
            if entry is not None:
                # The hottest path inlines its small steps (a call costs more than its
                # body here): _usable without a check is _expired's test.
                if self._check is None and time.monotonic() - entry.created_at < self._max_lifetime:
                    return entry.client
                if self._usable(entry):
                    return entry.client
        return checkout(self, timeout)  # type: ignore[no-any-return]

    def _made(self, permit: CreationPermit) -> C:
        try:
            return call_sync("create", self._create)  # type: ignore[no-any-return]
        except BaseException as error:
            raise self._create_failed(permit, error) from error

    def _create_failed(self, permit: CreationPermit, error: BaseException) -> BaseException:
        """Return the claim; the error to raise (ours as is, the user's wrapped)."""
        permit.finish()
        if isinstance(error, OrbitError) or not isinstance(error, Exception):
            return error
        self.counters.create_errors += 1
        return ClientCreateError(
            f"create() failed for key {self.key}: {error!r:.200}", key=self.key
        )

    def _usable(self, entry: Entry[C]) -> bool:
        if time.monotonic() - entry.created_at >= self._max_lifetime:
            self.discard(entry.client)
            return False
        if self._check is None:
            return True
        try:
            healthy = call_sync("check", self._check, entry.client) is not False
        except Exception:
            healthy = False
        except BaseException:  # KeyboardInterrupt mid-check: the client's state is unknown
            self.counters.check_failures += 1
            self.discard(entry.client)
            raise
        if not healthy:
            self.counters.check_failures += 1
            self.discard(entry.client)
        return healthy

    def putconn(self, client: C) -> None:
        """Hand a client back: reset it, then keep it idle or close it (one table step).

        Raises:
            UnknownClient: this pool did not check ``client`` out (or took it back).
        """
        entry = self._checked_in(client)
        if entry is None:
            return
        if self._closed:
            self._retire(entry)
            return
        if self._reset is not None:
            try:
                call_sync("reset", self._reset, client)
            except BaseException as error:  # KeyboardInterrupt too: retired, then raised
                self.counters.reset_failures += 1
                self._retire(entry)
                if isinstance(error, Exception):
                    return
                raise
        if not self._give_back(entry):
            self._hand_over(entry)

    def _hand_over(self, entry: Entry[C]) -> None:
        """Retire ``entry`` in a closing thread, off the caller's path (once closed: here)."""
        if not self._retirer.put(entry):
            self._retire(entry)  # the pool closed meanwhile: closed before this returns

    def _checked_in(self, client: C) -> Entry[C] | None:
        """The entry of a returned client, no longer checked out; None in a forked child.

        Raises:
            UnknownClient: this pool did not check ``client`` out (or took it back).
        """
        if self._fork != _fork.generation:
            return None  # the parent's client: never touched here
        entry = self._out.pop(id(client), None)  # one dict step: atomic, no lock needed
        if entry is None or entry.client is not client:
            raise UnknownClient(
                f"{type(client).__name__} object was not checked out of this pool", key=self.key
            )
        return entry

    def _give_back(self, entry: Entry[C]) -> bool:
        """The table step of a return: True if kept idle, else the caller closes the client."""
        now = time.monotonic()
        age = now - entry.created_at
        if age >= self._max_lifetime:
            return False
        in_turn = age < self._turn and entry.uses % self._turn_uses != 0  # _in_turn, inlined
        with self._lock:
            if self._closed:  # close() has taken the idle list: this one closes too
                return False
            kept = self._give_back_unit(
                entry.rid, self._idle_limit, self._max_live, in_turn, self._borrowers
            )
            if kept:
                entry.idle_since = now
                self._idle.append(entry)
            else:
                self._handed_over = True
        return kept

    def discard(self, client: C) -> None:
        """Close a checked-out client instead of returning it (it is broken, say).

        In a forked child a client of the parent is left alone, as :meth:`putconn` does.

        Raises:
            UnknownClient: this pool did not check ``client`` out.
        """
        entry = self._checked_in(client)
        if entry is not None:
            self._retire(entry)

    def _unregister(self, entry: Entry[C]) -> None:
        """Close ``entry``'s resource in the table, once its client is closed."""
        self.counters.retired += 1
        if self._fork == _fork.generation:
            self._settle(lambda pool: pool.unregister(entry.rid))

    def _settle(self, step: Callable[[Pool], object]) -> None:
        """A table step that must outlive :meth:`close`; OrbitError is ignored.

        After ``close()`` (a client handed back late, a waiter counting itself
        out) it runs on a handle of its own, since the pool's is closed: else
        the resource would hold its unit of ``max_live``, or the waiter stay
        counted for other processes, for the rest of this process's life.
        """
        with contextlib.suppress(OrbitError):
            try:
                step(self._pool)
            except FleetError:  # the handle is closed
                with Pool(self._fleet, kind=self._pool.kind) as own:
                    step(own)

    def _retire(self, entry: Entry[C]) -> None:
        """Close the client, then its resource in the table (the budget returns last, also
        after a close that raised a BaseException, which propagates)."""
        try:
            self._close_quietly(entry.client)
        finally:
            self._unregister(entry)

    def _close_quietly(self, client: C) -> None:
        try:
            run_anywhere(self._close, client)
        except Exception:
            self.counters.close_errors += 1
        self.counters.closed += 1

    @contextlib.contextmanager
    def client(self, timeout: float | None = None) -> Iterator[C]:
        """``with pool.client() as c:`` check out, use, hand back (even if the block raised).

        Raises:
            PoolTimeout, PoolClosed, TooManyRequests, ClientCreateError, InvalidPoolOptions:
                as :meth:`getconn`.
        """
        client = self.getconn(timeout)
        try:
            yield client
        finally:
            self.putconn(client)

    # -- asyncio checkout -------------------------------------------------------------

    async def getconn_async(self, timeout: float | None = None) -> C:
        """Asyncio twin of :meth:`getconn`; never blocks the event loop.

        ``create``, ``check`` and ``reset`` run on the loop when they are
        coroutine functions, else in a worker thread; waiting uses the pool's
        readiness descriptor.

        Raises:
            PoolTimeout, PoolClosed, TooManyRequests, ClientCreateError, InvalidPoolOptions:
                as :meth:`getconn`.
        """
        self.counters.requests += 1
        if timeout is not None:
            seconds("timeout", timeout)
        await serve_async(self)
        return await checkout_async(self, timeout)  # type: ignore[no-any-return]

    async def putconn_async(self, client: C) -> None:
        """Asyncio twin of :meth:`putconn`.

        Raises:
            UnknownClient: this pool did not check ``client`` out.
        """
        entry = self._checked_in(client)
        if entry is None:
            return
        if self._closed:  # closed on this loop, as the rest of close_async's
            await retire(self, entry)
            return
        if self._reset is not None:
            try:
                await call_async(self._reset, client)
            except Exception:
                self.counters.reset_failures += 1
                await retire(self, entry)
                return
        if not self._give_back(entry):
            hand_over(self, entry)  # closed off this caller's path

    async def discard_async(self, client: C) -> None:
        """Asyncio twin of :meth:`discard`.

        Raises:
            UnknownClient: this pool did not check ``client`` out.
        """
        entry = self._checked_in(client)
        if entry is not None:
            await retire(self, entry)

    @contextlib.asynccontextmanager
    async def client_async(self, timeout: float | None = None) -> AsyncIterator[C]:
        """``async with pool.client_async() as c:`` the asyncio checkout.

        Raises:
            PoolTimeout, PoolClosed, TooManyRequests, ClientCreateError, InvalidPoolOptions:
                as :meth:`getconn`.
        """
        client = await self.getconn_async(timeout)
        try:
            yield client
        finally:
            await self.putconn_async(client)

    # -- inspection and lifecycle -----------------------------------------------------

    def statistics(self) -> ClientPoolStatistics:
        """Fleet-wide live, idle, in use, waiting, creating and dead-owner counts of the key,
        plus this process's own counters (see :class:`ClientPoolStatistics`).

        Raises:
            PoolClosed: the pool is closed.
        """
        self._local()
        with self._lock:
            local = (len(self._idle), len(self._out), self._waiters)
        return collect(self, local)

    def close(self) -> None:
        """Stop the upkeep thread and close every idle client of this process. Idempotent.

        Returns once the clients that returns handed over are closed too. Clients
        still checked out are closed when they are handed back. An
        asyncio ``close`` callable is run to completion on a helper loop; inside
        asyncio code prefer :meth:`close_async`.
        """
        for entry in self._shut():
            self._retire(entry)
        self._pool.close()

    async def close_async(self) -> None:
        """Asyncio twin of :meth:`close`: the idle clients are closed on this loop, and so
        are the ones returns handed over (their closes are awaited)."""
        idle = await asyncio.to_thread(self._shut)  # it joins the pool's threads: off the loop
        for entry in idle:
            await retire(self, entry)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._pool.close()

    def _shut(self) -> list[Entry[C]]:
        """Mark closed, stop the upkeep thread; the idle entries to retire (none twice).

        A second caller gets none, once the closes that returns queued are done.
        """
        if self._closed:
            if self._fork == _fork.generation:
                self._retirer.close()  # waits as the first caller's does
            return []
        self._closed = True
        if self._fork != _fork.generation:
            return []  # the parent's clients, upkeep thread and socket
        self._upkeep.close()
        self._retirer.close()
        if self._server is not None:
            self._server.close()
        with self._lock:
            idle, self._idle = self._idle, []
        return idle

    def __enter__(self) -> ClientPool[C]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError(
            "a ClientPool holds this process's clients and cannot be pickled; "
            "build one in the other process"
        )

    def __repr__(self) -> str:
        try:
            state = "closed" if self._closed else f"idle={len(self._idle)} out={len(self._out)}"
            return f"<ClientPool key={self.key} max_live={self.options.max_live} {state}>"
        except Exception:  # a repr never raises
            return "<ClientPool (unavailable)>"


def _bad_options(options: object) -> OrbitError:
    return InvalidPoolOptions(
        f"options must be a PoolOptions, got {type(options).__name__}", key="options"
    )
