"""ClientPool: a client pool whose limits hold across every process of a fleet.

Each process keeps its own clients (a client is only ever used by the process
that created it, so session state, prepared statements, ``LISTEN`` and advisory
locks keep working) and the fleet's pool table counts them all under one key:

* a created client is registered with one unit active (never visible as idle);
* checkout takes one of this process's idle clients of the key, or claims
  creation under ``max_live`` host-wide, or waits, counted as a waiter in the
  table;
* return decides in one table step whether the client stays idle (fleet-wide
  idle below ``max_idle``, nobody elsewhere stranded at ``max_live``) or is
  retired;
* an upkeep thread per pool retires idle clients that a waiter elsewhere
  needs, enforces ``idle_timeout`` and ``max_lifetime``, refills the
  ``min_idle`` floor and reports dead members, so their clients and claims
  come back without a supervisor.

ClientPool is the public face. Each part is a class of its own, given the
parts it uses, and none imports this module:

=============  ================  ==================================================
part           module            owns
=============  ================  ==================================================
``Ledger``     ``_ledger``       this process's clients of the key and their table
                                 units, shared by the key's pools in the process
``Checkout``   ``_checkout``     the I/O-free checkout plan, its sync and asyncio
                                 drivers, create and check, and the return
``Retiring``   ``_retiring``     every close, sync and asyncio; the closing threads
``Upkeep``     ``_upkeep``       the upkeep thread
``Remote``     ``_remote``       remote mode: requests, borrowing, the owner's server
``collect``    ``_statistics``   :meth:`ClientPool.statistics`
=============  ================  ==================================================

The idle checkout and the plain return (:meth:`ClientPool.getconn`,
:meth:`ClientPool.putconn`) inline their small steps, where a call would cost
more than its body; the comments there say which.

A pool dropped without ``close()`` is collected (no part holds it); its
finalizer stops its upkeep thread and server, and leaves its idle clients to
the pools that share them or, the last of them, retires them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Final, Generic, TypeVar, final

from .._core import _fork
from .._core._errors import (
    InvalidBudget,
    InvalidPoolOptions,
    OrbitError,
    PoolClosed,
    PoolTimeout,
    TooManyRequests,
)
from .._core._fleet import Fleet
from .._core._region import SHM_DIR, client_socket_name
from ..pool import POOL_KIND, Pool, ResourceId
from ..pool._table import Table
from ._allowance import check_coordinator
from ._budget import Budget
from ._callbacks import call_async, call_sync, check_callable
from ._checkout import Checkout
from ._gate import Gate, leaver
from ._ledger import Entry, Family, Ledger
from ._options import PoolOptions, key_label, pool_key, seconds
from ._remote import Remote, check_payload
from ._retiring import Retiring
from ._statistics import ClientPoolStatistics, Counters, collect
from ._upkeep import Upkeep

C = TypeVar("C")
R = TypeVar("R")

#: How often the upkeep thread runs when nothing wakes it (death scans, timeouts).
UPKEEP_INTERVAL_S: Final = 0.2


@final
class ClientPool(Generic[C]):
    """A pool of clients (connections) capped host-wide across a fleet's processes.

    Args:
        fleet: the joined fleet (each worker process joins its own node).
        key: what one budget counts: a :class:`~orbitive.pool.Key`, or bytes
            or a str that is digested (a connection URL, say). Every pool of the
            key, in any process, counts against one ``max_live``. In one
            process, the pools of a key that create clients with one callable
            (equal ``create``) check out each other's idle clients; a waiter of
            any pool of the key never waits while another pool's client sits
            idle in its process (that client is closed, and the waiter creates).
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
        label: the key's name for people (``orbit pool``, metrics, error
            messages), 1..127 bytes of UTF-8; None: read from a str key that is
            a URL (without its password) or a plain name (see :attr:`label`).
        budget: a :class:`Budget` shared with other hosts, or None: the
            pools of every host that name it hold at most ``budget.total``
            live clients between them (``max_live`` still caps this host). Its
            pools on a host count under the budget's key (``key`` is then
            only checked): one budget, one share per host.
        sever: with a budget, ``sever(client)`` makes a client in use unusable
            at once from another thread (shuts its socket down), for when the
            host's units may lapse before the client is handed back; None:
            such a client is retired only when handed back.
        lends: other processes may borrow this pool's idle clients, as transaction
            mode's routers do (:meth:`getconn_or_borrow`, :meth:`lend`): a return
            then wakes every waiter of the key, in any process.

    Raises:
        InvalidPoolOptions: a bad key, callable, label or options object.
        InvalidBudget: ``budget`` is not a Budget, ``options.min_idle`` is above
            its total, or another pool of its key in this process names it
            otherwise.
        BudgetMismatch: the budget is held under another total (by another host,
            or another pool of this host).
        BudgetUnavailable: the budget's coordinator cannot be reached.
        UnsafeCoordinator: the coordinator may forget the units it grants.
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
        label: str | None = None,
        budget: Budget | None = None,
        sever: Callable[[C], Any] | None = None,
        lends: bool = False,
    ) -> None:
        self._closed = True  # until fully built
        check_callable("create", create, optional=False)
        check_callable("close", close, optional=False)
        check_callable("check", check, optional=True)
        check_callable("reset", reset, optional=True)
        check_callable("handler", handler, optional=True)
        check_callable("sever", sever, optional=True)
        if options is None:
            options = PoolOptions()
        elif type(options) is not PoolOptions:
            raise _bad_options(options)
        if options.mode != "session":
            raise InvalidPoolOptions(
                "mode='transaction' is for PostgreSQL pools (orbitive.clients.psycopg's,"
                " asyncpg's, Django's and SQLAlchemy's on psycopg): a ClientPool keeps each"
                " client in its process",
                key="mode",
            )
        self.key = pool_key(key)
        if budget is not None:
            if type(budget) is not Budget:
                raise InvalidBudget(
                    f"budget must be a Budget or None, got {type(budget).__name__}", key="budget"
                )
            budget.check_fits(options)
            check_coordinator(budget)
            self.key = budget.key
        self.budget = budget
        #: The key's name for people ("" when it has none: its digest shows instead).
        self.label = key_label(key, label)
        #: The label, or the key's digest: how messages name the pool.
        self.name = self.label or f"key {self.key}"
        self.options = options
        # The options the fast paths read, as plain attributes.
        self._max_live, self._idle_limit = options.max_live, options.idle_limit
        self._max_lifetime, self._turn = options.max_lifetime, options.handoff_after
        self._turn_uses = options.handoff_uses or 1 << 64  # None: no bound by count
        self._create, self._close, self._check, self._reset = create, close, check, reset
        self._handler, self._sever, self._lends = handler, sever, lends
        self._lent: dict[int, Entry[C]] = {}  # lend(): by id(client), until lent_back()
        self._fleet = fleet
        self._pool = Pool(fleet, kind=kind)
        limits = (options.max_live, options.min_idle, options.idle_limit)
        try:
            self._pool._t().describe(self.key, self.label.encode(), limits)
        except BaseException:
            self._pool.close()
            raise
        self.counters = Counters()
        # Each event loop's queue of asyncio checkouts (getconn_async), and its leave.
        self._gates: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[Gate, Callable[[], None]]
        ] = weakref.WeakKeyDictionary()
        self._release: weakref.finalize[Any, Any] | None = None
        self._start_local()
        self._closed = False

    def _start_local(self) -> None:
        """This process life's parts: the key's ledger, the closing, the checkout, the
        upkeep thread and the remote-mode server (a forked child makes its own)."""
        if self._release is not None:
            self._release.detach()  # a forked child: the parent's parts stay the parent's
        ledger: Ledger[C]
        family: Family[C]
        ledger, family = Ledger.attach(
            self._fleet,
            self._pool.kind,
            self.key,
            self._create,
            borrowers=self._handler is not None or self._lends,
        )
        retiring = Retiring(ledger, self.counters)
        if self.budget is not None:
            try:
                ledger.adopt(self.budget, self.options)
            except BaseException:
                retiring.release(ledger.detach(family))
                raise
        checkout: Checkout[C] = Checkout(
            self.key, self.options, self._pool, ledger, family, retiring, self.counters,
            self._create, self._close, self._check, self._reset, self._sever,
            name=self.name,
        )  # fmt: skip
        remote: Remote[C] | None = None
        if self._handler is not None:
            try:
                remote = Remote(
                    self._fleet.name, self._pool, self.key, self._handler, checkout, ledger,
                    family, retiring, self.counters,
                )  # fmt: skip
            except BaseException:
                retiring.release(ledger.detach(family))
                raise
        upkeep = Upkeep(
            self.key, self.options, self._fleet, self._pool, ledger, checkout, retiring,
            self.counters, self._create, UPKEEP_INTERVAL_S, family if self._lends else None,
        )  # fmt: skip
        self._ledger, self._family, self._retiring = ledger, family, retiring
        self._checkout = checkout
        self._upkeep, self._remote = upkeep, remote
        self._fork = _fork.generation
        self._release = weakref.finalize(
            self, _let_go, ledger, family, retiring, upkeep, remote, _fork.generation
        )
        self._release.atexit = False  # at exit the closing threads' wait is enough

    def _local(self) -> None:
        """Raise PoolClosed when closed; in a forked child, forget the parent's clients."""
        if self._closed:
            raise PoolClosed(f"client pool of {self.name} is closed", key=self.key)
        if self._fork != _fork.generation:
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
        self._remote_mode()
        data = check_payload(payload)
        self._local()
        return self._remote_mode().request(data, timeout)

    async def request_async(self, payload: bytes, timeout: float | None = None) -> bytes:
        """Asyncio twin of :meth:`request`.

        Raises:
            RemoteRequestError, PoolTimeout, PoolClosed, TooManyRequests, ClientCreateError:
                as :meth:`request`.
        """
        self._remote_mode()
        data = check_payload(payload)
        self._local()
        return await self._remote_mode().request_async(data, timeout)

    @property
    def serving(self) -> Callable[[C, bytes], Any]:
        """The remote-mode handler.

        Raises:
            InvalidPoolOptions: the pool was built without ``handler=``.
        """
        self._remote_mode()
        return self._handler  # type: ignore[return-value]  # set: remote mode has one

    def _remote_mode(self) -> Remote[C]:
        remote = self._remote
        if remote is None:
            raise InvalidPoolOptions(
                "request() needs a ClientPool built with handler=", key="handler"
            )
        return remote

    @property
    def table(self) -> Table:
        """The pool table this process uses."""
        return self._pool._t()

    @property
    def pool(self) -> Pool:
        """The underlying :class:`~orbitive.pool.Pool` handle."""
        return self._pool

    # -- sync checkout ----------------------------------------------------------------

    def getconn(self, timeout: float | None = None) -> C:
        """Check a client out; hand it back with :meth:`putconn`.

        Args:
            timeout: seconds to wait at most (float > 0); None: ``acquire_timeout``.

        Returns:
            One of this process's idle clients of the key (checked with
            ``check``), or a new one from ``create()``.

        Raises:
            PoolTimeout: none within the timeout.
            PoolClosed: the pool is closed.
            TooManyRequests: ``max_waiting`` callers of this process already wait.
            ClientCreateError: ``create()`` raised (the claim is returned).
            InvalidPoolOptions: a bad timeout, or ``create`` returned an awaitable.
            BaseException: one from ``create`` or ``check`` (KeyboardInterrupt,
                say), once what it took is returned or retired.
        """
        self.counters.requests += 1
        if timeout is not None:
            seconds("timeout", timeout)
        if self._fork == _fork.generation and not self._closed:  # the idle fast path
            entry = self._ledger.take(self._family)
            if entry is not None:
                # The hottest path inlines its small steps (a call costs more than its
                # body here): without a check, Checkout.usable is the lifetime test.
                if self._check is None and time.monotonic() - entry.created_at < self._max_lifetime:
                    return entry.client
                if self._checkout.usable(entry):
                    return entry.client
        self._local()
        return self._checkout.run(timeout).client

    def take_idle(self) -> C | None:
        """One of this process's idle clients of the key, checked with ``check``, or None
        at once: it never creates a client and never waits, so a thread that must not
        block (transaction mode's router) can ask. Hand it back with :meth:`putconn`.

        Raises:
            BaseException: one from ``check`` (KeyboardInterrupt, say), once the client
                is handed over to be closed.
        """
        if self._fork != _fork.generation or self._closed:
            return None
        while (entry := self._ledger.take(self._family)) is not None:
            if self._checkout.usable(entry):
                self.counters.requests += 1
                return entry.client
        return None

    def getconn_or_borrow(
        self, borrow: Callable[[], R | None], timeout: float | None = None
    ) -> C | R:
        """:meth:`getconn`, with ``borrow()`` tried before each claim or wait: what it
        returns, unless None, is returned instead of a client (transaction mode's
        router borrows another process's idle client this way, as a loan).

        Args:
            borrow: called before each claim or wait, in the calling thread; returns
                what stands in for a client (a loan), or None to go on waiting.
            timeout: seconds to wait at most (float > 0); None: ``acquire_timeout``.

        Returns:
            A client of this process (as :meth:`getconn`), or what ``borrow`` returned.

        Raises:
            PoolTimeout: neither within the timeout.
            PoolClosed: the pool is closed.
            TooManyRequests: ``max_waiting`` callers of this process already wait.
            ClientCreateError: ``create()`` raised (the claim is returned).
            InvalidPoolOptions: a bad timeout.
            BaseException: one from ``borrow``, ``create`` or ``check``, once what
                was taken is returned or retired.
        """
        self.counters.requests += 1
        if timeout is not None:
            seconds("timeout", timeout)
        self._local()
        got = self._checkout.run(timeout, borrow)
        if isinstance(got, Entry):
            return got.client
        self.counters.borrowed += 1
        return got

    def lend(self, rid: ResourceId, accept: Callable[[], R]) -> tuple[R, C] | None:
        """Accept a borrower's lease (``accept()``, the table step) and lend the idle
        client its unit names, out of the idle ones until :meth:`lent_back`, in one
        step: the upkeep's aging of undelivered reservations never meets it half done.

        Returns:
            What ``accept()`` returned and the client; None, with nothing accepted,
            when the client is gone (retired meanwhile).

        Raises:
            OrbitError: from ``accept``: a stale, replayed or aged-out lease (the
                client stays idle).
        """
        lent = self._ledger.accept_loan(rid, self._family, accept)
        if lent is None:
            return None
        accepted, entry = lent
        self._lent[id(entry.client)] = entry
        return accepted, entry.client

    def lent_back(self, client: C, *, keep: bool, complete: Callable[[], object]) -> None:
        """A client :meth:`lend` gave out is idle again, or (not ``keep``: broken, or in a
        session no one may inherit) closed; ``complete()`` gives the lease's unit back
        (with the client made idle in one step, or once it is handed over to close)."""
        entry = self._lent.pop(id(client))
        if keep and self._ledger.lent_back(entry, complete):
            return
        self._retiring.retire(entry)
        complete()

    def loan_socket(self, node: int) -> str:
        """Where the routers of node ``node`` take loans of this pool's clients."""
        tag = str(self.key)[:12]
        name = client_socket_name(self._fleet.name, self._pool.kind, node, tag, loans=True)
        return str(SHM_DIR / name)

    def putconn(self, client: C) -> None:
        """Hand a client back: reset it, then keep it idle or close it (one table step).

        A client checked out of another pool of the key in this process with
        the same ``create`` may be handed back here (they share their clients).

        Raises:
            UnknownClient: no pool of the key and ``create`` in this process
                checked ``client`` out, or it was handed back already.
            BaseException: one from ``reset``, once the client is handed over to
                be closed.
        """
        if self._fork != _fork.generation:
            return  # the parent's client: never touched here
        entry = self._ledger.checked_in(client, self._family)
        if self._reset is not None or self._closed:
            self._checkout.put(entry)
            return
        # The hottest path inlines Checkout.give_back (a call costs more than its body).
        now = time.monotonic()
        age = now - entry.created_at
        in_turn = age < self._turn and entry.uses % self._turn_uses != 0
        if age >= self._max_lifetime:
            self._retiring.hand_over(self._checkout.aged(entry))
        elif not self._ledger.give_back(entry, now, in_turn, self._idle_limit, self._max_live):
            self._retiring.hand_over(entry)

    def discard(self, client: C) -> None:
        """Close a checked-out client instead of returning it (it is broken, say).

        In a forked child a client of the parent is left alone, as :meth:`putconn` does.

        Raises:
            UnknownClient: as :meth:`putconn`.
            BaseException: one from ``close``, once the client's budget is returned.
        """
        if self._fork == _fork.generation:
            self._retiring.retire(self._ledger.checked_in(client, self._family))

    def check_idle(self, check: Callable[[C], Any]) -> int:
        """Check each idle client of this pool's family in this process with ``check``
        (not the pool's own): one that raises or returns False is closed, the others
        are handed back. Other processes' idle clients are theirs to check.

        Returns:
            How many were closed (int).

        Raises:
            PoolClosed: the pool is closed.
            InvalidPoolOptions: ``check`` returned an awaitable (use :meth:`check_idle_async`).
        """
        broken = 0
        for entry in self._take_every_idle():
            try:
                healthy = call_sync("check", check, entry.client) is not False
            except Exception:
                healthy = False
            if healthy:
                self.putconn(entry.client)
            else:
                broken += 1
                self.discard(entry.client)
        return broken

    async def check_idle_async(self, check: Callable[[C], Any]) -> int:
        """Asyncio twin of :meth:`check_idle` (``check`` may be a coroutine function)."""
        broken = 0
        for entry in self._take_every_idle():
            try:
                healthy = await call_async(check, entry.client) is not False
            except Exception:
                healthy = False
            if healthy:
                await self.putconn_async(entry.client)
            else:
                broken += 1
                await self.discard_async(entry.client)
        return broken

    def _take_every_idle(self) -> list[Entry[C]]:
        """Every idle client of this pool's family, checked out (PoolClosed when closed)."""
        self._local()
        taken = [self._ledger.take(self._family) for _ in range(len(self._family.idle))]
        return [entry for entry in taken if entry is not None]

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

        The tasks of one event loop are served first come first served: at most
        ``max_live`` of them check out at once, the others queue in arrival order
        (``_gate``), each holding its place until it hands its client back.

        ``create``, ``check`` and ``reset`` run on the loop when they are
        coroutine functions, else in a worker thread; waiting uses the pool's
        readiness descriptor. A caller cancelled while ``create`` or ``check``
        runs leaves it running; its client then joins the idle ones, or is
        closed.

        Raises:
            PoolTimeout, PoolClosed, TooManyRequests, ClientCreateError, InvalidPoolOptions:
                as :meth:`getconn`.
        """
        self.counters.requests += 1
        wait = self.options.acquire_timeout if timeout is None else seconds("timeout", timeout)
        self._local()
        if self._remote is not None:
            await self._remote.serve_async()
        loop = asyncio.get_running_loop()
        found = self._gates.get(loop)
        if found is None:
            gate = Gate(self._max_live, self.options.max_waiting, self.key)
            found = self._gates[loop] = (gate, leaver(gate, loop))
        gate, leave = found
        try:
            queued = await gate.enter(wait)
        except PoolTimeout:
            self.counters.timeouts += 1
            self.counters.queued += 1
            self.counters.waited_s += wait
            raise
        except TooManyRequests:
            self.counters.refused += 1
            raise
        if queued:
            self.counters.queued += 1
            self.counters.waited_s += queued
        try:
            entry = await self._checkout.run_async(max(wait - queued, 1e-3))
        except BaseException:  # cancelled or failed: its place goes to the next in turn
            gate.leave()
            raise
        entry.on_return = leave  # no await since the checkout: no cancel in between
        return entry.client

    async def putconn_async(self, client: C) -> None:
        """Asyncio twin of :meth:`putconn`. A caller cancelled while ``reset`` runs
        leaves it running; the client is then kept idle, or closed.

        Raises:
            UnknownClient, BaseException: as :meth:`putconn`.
        """
        if self._fork == _fork.generation:
            await self._checkout.put_async(self._ledger.checked_in(client, self._family))

    async def discard_async(self, client: C) -> None:
        """Asyncio twin of :meth:`discard`.

        Raises:
            UnknownClient, BaseException: as :meth:`discard`.
        """
        if self._fork == _fork.generation:
            await self._retiring.retire_async(self._ledger.checked_in(client, self._family))

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
        plus this process's own counts and this pool's counters (see
        :class:`ClientPoolStatistics`).

        Raises:
            PoolClosed: the pool is closed.
        """
        self._local()
        idle, in_use, waiting = self._ledger.counts()
        queued = sum(gate.queued for gate, _ in tuple(self._gates.values()))
        local = (idle, in_use, waiting + queued)
        allowance = self._ledger.allowance
        budget = (0, 0, 0, 0) if allowance is None else allowance.numbers()
        return collect(
            self._pool, self._fleet, self.key, self._ledger.census(), self.options.max_live,
            local, self.counters, budget,
        )  # fmt: skip

    def close(self) -> None:
        """Stop the upkeep thread and close this pool's clients in this process. Idempotent.

        Idle clients stay with this process's other pools of the key that
        share them (the same ``create``); the last of them closes them. Returns
        once the clients that returns handed over are closed too. Clients still
        checked out are closed when they are handed back. An asyncio ``close``
        callable is run to completion on a helper loop; inside asyncio code
        prefer :meth:`close_async`.

        Raises:
            BaseException: one from ``close`` (KeyboardInterrupt, say), once the
                clients not closed yet are left to a closing thread.
        """
        idle = self._shut()
        if self._fork == _fork.generation:
            self._retiring.retire_all(idle)
            self._upkeep.close()
            self._retiring.shut()
            self._resign()
        self._pool.close()

    async def close_async(self) -> None:
        """Asyncio twin of :meth:`close`: the idle clients are closed on this loop, and so
        are the ones returns handed over (their closes are awaited)."""
        idle = self._shut()
        if self._fork == _fork.generation:
            await self._retiring.retire_all_async(idle)
            await asyncio.to_thread(self._join)  # it joins the pool's threads: off the loop
            await self._retiring.wait_closing()
            await asyncio.to_thread(self._resign)
        self._pool.close()

    def _resign(self) -> None:
        """The last pool of the key in this process closed: its steward, if it is the
        host's, gives back the units the host no longer uses and resigns."""
        allowance = self._ledger.allowance
        if allowance is not None and self._ledger.left:
            allowance.close(wait=True)

    def _shut(self) -> list[Entry[C]]:
        """Mark closed and let go of this process's parts, waiting for nothing; the idle
        entries to retire, for the last pool of its family (none twice)."""
        if self._closed:
            return []
        self._closed = True
        if self._fork != _fork.generation:
            return []  # the parent's clients, upkeep thread and socket
        self._checkout.closed = True
        if self._release is not None:
            self._release.detach()  # closed: nothing left for the finalizer
        self._upkeep.stop()
        if self._remote is not None:
            self._remote.close()
        return self._ledger.detach(self._family)

    def _join(self) -> None:
        """Wait for the upkeep thread and every queued close."""
        self._upkeep.close()
        self._retiring.shut()

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
            idle, out, _ = self._ledger.counts()
            state = "closed" if self._closed else f"idle={idle} out={out}"
            return f"<ClientPool key={self.key} max_live={self.options.max_live} {state}>"
        except Exception:  # a repr never raises
            return "<ClientPool (unavailable)>"


def _let_go(
    ledger: Ledger[Any],
    family: Family[Any],
    retiring: Retiring,
    upkeep: Upkeep[Any],
    remote: Remote[Any] | None,
    generation: int,
) -> None:
    """A pool dropped unclosed, now collected: its upkeep thread and server stop, its
    idle clients stay with the pools that share them or, the last of its family, are
    retired in a closing thread, and its closing threads end once done."""
    if generation != _fork.generation:
        return  # a forked child's copy: the parent's parts
    upkeep.stop()
    if remote is not None:
        remote.close()
    retiring.release(ledger.detach(family))
    retiring.end()
    if ledger.allowance is not None and ledger.left:
        ledger.allowance.close(wait=False)


def _bad_options(options: object) -> OrbitError:
    return InvalidPoolOptions(
        f"options must be a PoolOptions, got {type(options).__name__}", key="options"
    )
