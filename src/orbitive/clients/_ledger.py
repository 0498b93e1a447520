"""The ledger: this process's clients of one key, and their units in the pool table.

**One ledger per process life, fleet member (a ``Fleet`` object, one node),
pool table kind and key, shared by every ClientPool of that key in the
process.** The pool table counts waiters per node, and two of its decisions
trust that the idle clients of a node serve any waiter of that node: a return
stays idle (instead of being closed) for a waiter of its own node, and the
upkeep never retires an idle client while its node has a waiter. With one list
per ClientPool that trust was broken: with two pools of one key in one
process, the table kept pool A's client idle for pool B's waiter, which could
not see it, and nobody retired it, so B's waiter timed out while the budget
sat idle in its own process. A pool dropped without ``close()`` did the same,
and its idle clients then held their budget with no upkeep left to retire
them. One ledger per key and process makes the trust true again, two ways:

* the pools of the key that create their clients with one callable (equal
  ``create``) form a :class:`Family` and check out each other's clients, so a
  waiter of one takes the idle client of another, at no cost;
* a key is a budget, not a promise that clients are interchangeable: a sync
  and an asyncio psycopg pool of one database share it, as do pools that
  differ in a client-side setting such as a row factory. A waiter at
  ``max_live`` that finds only another family's clients idle here retires one
  (:meth:`Ledger.take_foreign`), and creates its own in the unit that returns.

Weighed against this: counting waiters per pool in the table (a layout change
in Python and C, for the same close and reconnect as the second way, and
without the reuse of the first), or retiring another pool's idle clients
always (a close and a reconnect where reuse is free).

Every client the process created for the key and has not retired is in
exactly one place:

* its family's ``idle`` list: its unit free in the table (a borrower elsewhere
  may reserve it), newest last, which is the one a checkout takes;
* its family's ``out`` map: its unit active, checked out by a caller who hands
  it back to a pool of the family (:meth:`Ledger.checked_in`);
* in flight: in neither, held by exactly one piece of code that gives it back
  or retires it: a close queued or running, a check, reset or request that a
  cancelled caller left running, a borrower's request it is lent to.

The ledger decides and records; it never calls a user callable (``create``,
``check``, ``reset``, ``close``, a handler). The checkout (:mod:`._checkout`)
and the closing (:mod:`._retiring`) call them, and bring it what came of them.
A step that moves a client between places runs under the ledger's lock
together with its table step, so the two never disagree.

A client is closed with the ``close`` of the pool that created it
(:attr:`Entry.close`), and checked and reset by the pool of its family that
checks it out and takes it back. A pool's ``close()`` leaves its family's idle
clients to the family's other pools; the last pool of a family to leave
(closed, or dropped unclosed and collected) takes them out to retire them
(:meth:`Ledger.detach`), so no client keeps its budget with no pool left to
use it or retire it.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar, final

from .._core import _fork
from .._core._errors import (
    BudgetMismatch,
    BusyError,
    CreationBudgetError,
    DrainingError,
    FleetError,
    InvalidBudget,
    NotOwnerError,
    OrbitError,
    PoolClosed,
    StaleError,
    UnknownClient,
)
from .._core._fleet import Fleet
from ..pool import CreationPermit, Key, Pool, ResourceId
from ..pool._availability import (
    FOR_OWN_WAITER,
    Census,
    add_waiter,
    claim_in_turn,
    claim_warm,
    key_census,
    retire_idle,
)
from ..pool._table import Table
from ._allowance import Allowance
from ._budget import Budget
from ._options import PoolOptions

C = TypeVar("C")
_E = TypeVar("_E")

#: The cap of a key no budget limits (above any max_live, a u32).
NO_CAP: Final = 1 << 32
#: What a take refuses for: reserved by a borrower, closed or reset, not ours, draining.
_REFUSED: Final = (BusyError, StaleError, NotOwnerError, DrainingError)


@dataclass(slots=True, eq=False)
class Family(Generic[C]):
    """The pools of one key in one process that create their clients with one callable,
    and their clients: ``idle`` (newest last) and ``out`` (by ``id(client)``).

    ``pools`` of them are open; with none, the family keeps no client idle. Only
    the ledger changes it.
    """

    create: Callable[[], Any]
    pools: int = 0
    idle: list[Entry[C]] = field(default_factory=list)
    out: dict[int, Entry[C]] = field(default_factory=dict)


@dataclass(slots=True, eq=False)
class Entry(Generic[C]):
    """A client, its resource id, its family, the ``close`` and ``sever`` of the pool that
    created it, its ``time.monotonic()`` creation and idle times, how many checkouts it
    served, and whether it was severed (its budget unit lapsing while it was in use)."""

    client: C
    rid: ResourceId
    family: Family[C]
    close: Callable[[C], Any]
    created_at: float
    idle_since: float = 0.0
    uses: int = 0
    sever: Callable[[C], Any] | None = None
    severed: bool = False
    #: Called once when the checkout ends in a hand-back (an asyncio checkout's place
    #: in its gate), else None.
    on_return: Callable[[], None] | None = None

    def in_turn(self, now: float, turn: float, turn_uses: int) -> bool:
        """Whether the client may still serve its own process while another process waits:
        younger than ``turn`` seconds, and its uses not a multiple of ``turn_uses``."""
        return now - self.created_at < turn and self.uses % turn_uses != 0


@final
class Ledger(Generic[C]):
    """This process's clients of one key and their table units (see the module).

    Build one with :meth:`attach`, never directly; :meth:`detach` once per attach.
    """

    def __init__(self, fleet: Fleet, kind: int, key: Key, name: tuple[int, int, Key]) -> None:
        self.key = key
        #: How the log records name the fleet of the key's pools.
        self.where = f"client pool of fleet {fleet.name!r}"
        self._fleet, self._kind, self._name = fleet, kind, name
        self._handle = Pool(fleet, kind=kind)  # its own: it outlives any one ClientPool's
        self._lock = threading.Lock()
        self._families: list[Family[C]] = []  # those with a pool open
        self.waiters = 0  # this process's callers waiting at max_live
        self.handed_over = False  # the last return closed its client (see polite)
        self.borrowers = False  # a pool of the key serves remote requests
        #: The key's budget on this host (:mod:`._allowance`), if its pools name one.
        self.allowance: Allowance | None = None
        #: The cap the budget puts on the key now (the upkeep keeps it current).
        self.cap = NO_CAP
        #: ``time.monotonic()`` from which a return retires its client instead of keeping
        #: it idle: the key is over its budget's cap, or the budget's units may lapse soon.
        self.shed_at = math.inf
        self.left = False  # every pool of the key in this process has left
        self._generation = _fork.generation
        # The owner's take and give-back steps: one C call each where built, else Python.
        operations = self._handle._operations
        self._take_unit = self._handle._take if operations is None else operations.take
        self._give_back_unit = (
            self._handle._give_back if operations is None else operations.give_back
        )

    # -- the pools of the key -----------------------------------------------------------

    @classmethod
    def attach(
        cls, fleet: Fleet, kind: int, key: Key, create: Callable[[], Any], *, borrowers: bool
    ) -> tuple[Ledger[Any], Family[Any]]:
        """The ledger of ``key`` for a new ClientPool on ``fleet``'s table ``kind``, and the
        pool's family: the pools of the key that create clients with ``create``.

        Args:
            borrowers: the pool serves remote requests (its returns then wake
                every waiter, since any process may reserve the client).

        Raises:
            MalformedError, FleetError, LayoutMismatch, AccessDenied: as
                :class:`~orbitive.pool.Pool`.
        """
        name = (id(fleet), kind, key)  # the ledger holds the fleet: its id stays unique
        with _ledgers_lock:
            ledger = _ledgers.get(name)
            if ledger is None:
                ledger = _ledgers[name] = cls(fleet, kind, key, name)
            family = next((f for f in ledger._families if f.create == create), None)
            if family is None:
                family = Family(create)
                ledger._families.append(family)
            family.pools += 1
            ledger.borrowers |= borrowers
        with contextlib.suppress(OrbitError):  # the mark only describes: never fail the pool
            ledger._table().mark_opened(key, True)
        return ledger, family

    def detach(self, family: Family[C]) -> list[Entry[C]]:
        """A pool of ``family`` leaves (closed, or dropped unclosed); once per attach.

        Returns:
            For the family's last pool, its idle entries, out of the ledger, for
            the caller to retire (the family keeps none idle after it); else
            none. None in a forked child of the process that attached (they
            are the parent's).
        """
        if self._generation != _fork.generation:
            return []
        with _ledgers_lock:
            family.pools -= 1
            if family.pools:
                return []
            self._families.remove(family)
            last = not self._families
            if last and _ledgers.get(self._name) is self:
                del _ledgers[self._name]
        with self._lock:
            idle, family.idle = family.idle, []
        if last:
            self.left = True
            self._unmark_opened()
            self._handle.close()  # a later table step runs on a handle of its own (_settle)
        return idle

    def adopt(self, budget: Budget, options: PoolOptions) -> None:
        """Count the key's clients against ``budget`` (the first pool of it in the process
        makes the allowance; the others must name the same budget).

        Raises:
            BudgetMismatch: another pool of the key in this process names it with
                another total; and as :class:`~._allowance.Allowance`.
            InvalidBudget: another pool of the key in this process names it otherwise
                (its URL, ttl or hand-over bound).
            BudgetUnavailable, UnsafeCoordinator: as :class:`~._allowance.Allowance`.
        """
        with _ledgers_lock:
            if self.allowance is None:
                self.allowance = Allowance(self._fleet, budget, options, self._kind)
            elif self.allowance.budget != budget:
                held = self.allowance.budget
                if held.total != budget.total:
                    raise BudgetMismatch(
                        f"budget {budget.name!r} is held under total {held.total} by another "
                        f"pool of this process, not {budget.total}",
                        key=budget.name,
                        total=budget.total,
                        found=held.total,
                    )
                raise InvalidBudget(
                    f"budget {budget.name!r}: the pools of one budget in a process must name "
                    f"it alike, got {budget!r} and {self.allowance.budget!r}",
                    key="budget",
                )

    # -- taking and giving back ---------------------------------------------------------

    def take(self, family: Family[C]) -> Entry[C] | None:
        """The family's newest idle client, its unit now active and its entry out.

        None when the family has none idle, or the table refuses the newest
        (then :meth:`take_sorting` looks further).
        """
        with self._lock:
            idle = family.idle
            if not idle:
                return None
            entry = idle.pop()
            try:
                self._take_unit(entry.rid)
            except _REFUSED:
                idle.append(entry)
                return None
            family.out[id(entry.client)] = entry
            entry.uses += 1
        return entry

    def take_sorting(self, family: Family[C]) -> tuple[Entry[C] | None, list[Entry[C]]]:
        """:meth:`take`, newest first past the idle clients the table refuses.

        Returns:
            The entry taken (or None), and the family's entries whose resource
            was closed, reset or drained: out of the ledger, for the caller to
            retire. One a borrower reserved stays idle (the borrower's request
            runs on it).
        """
        doomed: list[Entry[C]] = []
        reserved: list[Entry[C]] = []
        with self._lock:
            idle = family.idle
            try:
                while idle:
                    entry = idle.pop()
                    try:
                        self._take_unit(entry.rid)
                    except BusyError:  # a borrower reserved it: theirs now
                        reserved.append(entry)
                        continue
                    except (StaleError, NotOwnerError, DrainingError):
                        doomed.append(entry)
                        continue
                    family.out[id(entry.client)] = entry
                    entry.uses += 1
                    return entry, doomed
                return None, doomed
            finally:
                idle[:0] = reserved

    def take_foreign(self, family: Family[C]) -> Entry[C] | None:
        """The oldest idle client of another family than ``family``, out of the ledger
        with its unit active, for the caller to retire: a waiter of ``family`` can then
        create in its unit. None when the table lets none go."""
        with self._lock:
            for other in self._families:
                if other is family:
                    continue
                for entry in other.idle:
                    if retire_idle(self._table(), entry.rid, FOR_OWN_WAITER, 0, 0):
                        other.idle.remove(entry)
                        return entry
        return None

    def checked_in(self, client: C, family: Family[C]) -> Entry[C]:
        """The entry of a client handed back to a pool of ``family``, out of the ledger
        (the caller keeps or retires it); its ``on_return`` called and cleared.

        Raises:
            UnknownClient: no pool of the family in this process checked
                ``client`` out, or it was handed back already.
        """
        entry = family.out.pop(id(client), None)  # one dict step: atomic, no lock needed
        if entry is None or entry.client is not client:
            raise UnknownClient(
                f"{type(client).__name__} object was not checked out of this pool", key=self.key
            )
        on_return, entry.on_return = entry.on_return, None
        if on_return is not None:
            on_return()
        return entry

    def recall(self, entry: Entry[C]) -> Entry[C]:
        """``entry`` out of its family's ``out``: its checkout gave up on it and never
        hands it back."""
        entry.family.out.pop(id(entry.client), None)
        return entry

    def give_back(
        self, entry: Entry[C], now: float, in_turn: bool, max_idle: int, max_live: int
    ) -> bool:
        """The table step of a return: True if ``entry`` is idle now, else the caller
        retires it (the fleet holds ``max_idle``, another process waits for its unit,
        its family has no pool left, it was severed, or the key's budget sheds)."""
        family = entry.family
        with self._lock:
            if not family.pools or now >= self.shed_at or entry.severed:
                return False
            max_live = min(max_live, self.cap)
            kept = self._give_back_unit(entry.rid, max_idle, max_live, in_turn, self.borrowers)
            if kept:
                entry.idle_since = now
                family.idle.append(entry)
            else:
                self.handed_over = True
        return kept

    def register(
        self,
        permit: CreationPermit,
        client: C,
        family: Family[C],
        close: Callable[[C], Any],
        *,
        active: bool,
        sever: Callable[[C], Any] | None = None,
    ) -> Entry[C]:
        """Register a created client of ``family``, in use (its entry out) or idle; the
        permit ends after.

        Raises:
            PoolClosed: an idle one, once its family has no pool left.
            KeyFullError, LaneFullError, LayoutMismatch, FleetError: the table's.
        """
        with permit, self._lock:
            if not (active or family.pools):
                raise PoolClosed(f"client pool of key {self.key} is closed", key=self.key)
            rid = self._table().register(self.key, 1, 1 if active else 0)
            now = time.monotonic()
            entry = Entry(client, rid, family, close, now, now, 1 if active else 0, sever)
            if active:
                family.out[id(client)] = entry
            else:
                family.idle.insert(0, entry)  # the oldest end: retired first, taken last
        return entry

    def unregister(self, entry: Entry[C]) -> None:
        """Close ``entry``'s resource in the table, once its client is closed: its unit of
        ``max_live`` returns. Never in a forked child (the parent's)."""
        if self._generation == _fork.generation:
            self._settle(lambda handle: handle.unregister(entry.rid))

    # -- remote mode ---------------------------------------------------------------------

    def lend(self, rid: ResourceId, family: Family[C]) -> Entry[C] | None:
        """The idle entry of ``family`` a borrower's accepted lease names, out of ``idle``
        while its request runs (so a close does not close it under the handler); None
        if gone or of another family."""
        with self._lock:
            for entry in family.idle:
                if entry.rid == rid:
                    family.idle.remove(entry)
                    return entry
        return None

    def accept_loan(
        self, rid: ResourceId, family: Family[C], accept: Callable[[], _E]
    ) -> tuple[_E, Entry[C]] | None:
        """:meth:`lend`, with the lease accepted (``accept()``, the table step) in the
        same hold of the ledger's lock: :meth:`age_reservations` never finds the entry
        idle with its unit accepted. None (nothing accepted) when the entry is gone.

        Raises:
            OrbitError: from ``accept`` (the entry stays idle).
        """
        with self._lock:
            entry = next((entry for entry in family.idle if entry.rid == rid), None)
            if entry is None:
                return None
            accepted = accept()
            family.idle.remove(entry)
        return accepted, entry

    def age_reservations(self, family: Family[C], grace: float) -> int:
        """Age out the reservations of ``family``'s idle units that no borrower delivered
        within ``grace`` seconds (it died or stalled between its reservation and its
        lease), so the unit serves again; a lease delivered later is refused. Returns
        how many were aged out."""
        grace_ms = math.ceil(grace * 1000.0)
        aged = 0
        with self._lock:  # idle here means accepted by no one (see accept_loan)
            for entry in family.idle:
                with contextlib.suppress(OrbitError):  # closed or reset meanwhile
                    aged += self._table().reconcile(entry.rid, 0, grace_ms)
        return aged

    def lent_back(self, entry: Entry[C], complete: Callable[[], object] | None = None) -> bool:
        """A :meth:`lend` entry idle again (the oldest end); False once its family has no
        pool left, and the caller retires it. ``complete()`` (the lease's unit given
        back) runs in the same hold of the lock, before: :meth:`age_reservations`
        never finds the entry idle with its unit accepted. Without it, the caller
        completes the unit just after."""
        family = entry.family
        with self._lock:
            if not family.pools:
                return False
            if complete is not None:
                complete()
            entry.idle_since = time.monotonic()
            family.idle.insert(0, entry)
        return True

    # -- the upkeep ----------------------------------------------------------------------

    def holds_idle(self) -> bool:
        """Whether this process holds an idle client of the key (a glance, no lock)."""
        return any(family.idle for family in self._families)

    def idle_to_retire(
        self, due: Callable[[Entry[C]], bool], reason: int, max_live: int, min_idle: int
    ) -> list[Entry[C]]:
        """Take out, oldest first in each family, the idle entries ``due`` names and the
        table lets go for ``reason`` (:func:`~orbitive.pool._availability.retire_idle`),
        up to the first it refuses; the caller retires them."""
        max_live = min(max_live, self.cap)
        taken: list[Entry[C]] = []
        for family in list(self._families):
            for entry in list(family.idle):
                if not due(entry):
                    continue
                with self._lock:
                    if entry not in family.idle:
                        continue
                    if not retire_idle(self._table(), entry.rid, reason, max_live, min_idle):
                        return taken
                    family.idle.remove(entry)
                taken.append(entry)
        return taken

    # -- claims and waiters --------------------------------------------------------------

    def claim(self, max_live: int) -> CreationPermit | None:
        """A creation claim under ``max_live``, fleet-wide, oldest waiting process first;
        None at the bound or while another process waited longer
        (:func:`~orbitive.pool._availability.claim_in_turn`). With a budget, under its
        cap too, decided in the budget's section (:meth:`~._allowance.Allowance.capped`)."""
        table = self._table()

        def claim(cap: int) -> CreationPermit | None:
            try:
                index = claim_in_turn(table, self.key, min(max_live, cap))
            except CreationBudgetError:
                return None
            return CreationPermit(table, self.key, index)

        allowance = self.allowance
        return claim(NO_CAP) if allowance is None else allowance.capped(claim)

    def claim_warm(self, max_live: int, min_idle: int) -> CreationPermit | None:
        """A claim for this process's share of the ``min_idle`` deficit, or None
        (:func:`~orbitive.pool._availability.claim_warm`); with a budget, under its cap too."""
        table = self._table()

        def claim(cap: int) -> CreationPermit | None:
            try:
                index = claim_warm(table, self.key, min(max_live, cap), min_idle)
            except CreationBudgetError:
                return None
            return CreationPermit(table, self.key, index)

        allowance = self.allowance
        return claim(NO_CAP) if allowance is None else allowance.capped(claim)

    def start_waiting(self, max_waiting: int) -> int | None:
        """Count one waiter of this process in, here and in the table; the key's version,
        or None when ``max_waiting`` callers of the process already wait."""
        with self._lock:
            if self.waiters >= max_waiting:
                return None
            self.waiters += 1
        try:
            return add_waiter(self._table(), self.key, 1)
        except BaseException:
            with self._lock:
                self.waiters -= 1
            raise

    def stop_waiting(self, waited: tuple[int, bool] | None = None) -> None:
        """Count a waiter of :meth:`start_waiting` out again; ``waited``, the
        ``(microseconds, timed_out)`` of a wait that ended in a client or a timeout,
        goes to the key's wait counters (None: it ended otherwise)."""
        with self._lock:
            self.waiters -= 1
        self._settle(lambda handle: add_waiter(handle._t(), self.key, -1, waited))

    def polite(self) -> bool:
        """Whether a checkout lets another process's waiter create first.

        True when this process's last return closed its client while another
        process waited, and one still waits: the capacity was freed for that
        waiter, and a checkout of ours that claimed it at once (it is already
        running, the waiter still waking) would strand the waiter again and
        waste a connection. Reading it clears the mark.
        """
        if not self.handed_over:
            return False
        self.handed_over = False
        table = self._table()
        return key_census(table, self.key).others_waiting(table.node) > 0

    # -- inspection ----------------------------------------------------------------------

    def census(self) -> Census:
        """The key's fleet-wide live, idle, creating and waiting counts, in one step."""
        return key_census(self._table(), self.key)

    def in_use(self) -> list[Entry[C]]:
        """This process's clients of the key checked out and not severed, newest first."""
        with self._lock:
            out = [entry for family in self._families for entry in family.out.values()]
        return sorted((e for e in out if not e.severed), key=lambda e: -e.created_at)

    def shed(self, cap: int, at: float) -> None:
        """The budget's cap now, and the ``time.monotonic()`` from which returns retire."""
        self.cap, self.shed_at = cap, at

    def counts(self) -> tuple[int, int, int]:
        """This process's idle, checked-out and waiting counts for the key."""
        with self._lock:
            return (
                sum(len(family.idle) for family in self._families),
                sum(len(family.out) for family in self._families),
                self.waiters,
            )

    # -- the table -----------------------------------------------------------------------

    def _table(self) -> Table:
        return self._handle._t()

    def _unmark_opened(self) -> None:
        """Clear the key's opened mark of this node (:meth:`attach` set it, so that an
        observer lists the key however few clients it holds), unless a new ledger of the
        key opened meanwhile: it marked after it was listed, and the check runs in the
        table's section, so the later of the two wins. Soon, not now, in a finalizer
        that runs while this thread is inside a table step; a table that refuses
        leaves the mark (it only describes)."""
        with contextlib.suppress(OrbitError):
            table = self._table()
            table.run_soon(
                lambda: table.mark_opened(self.key, False, lambda: self._name not in _ledgers)
            )

    def _settle(self, step: Callable[[Pool], object]) -> None:
        """A table step that must outlive the pools (OrbitError is ignored).

        Once every pool left (a client handed back late, a waiter counting
        itself out) it runs on a handle of its own, since the ledger's is
        closed: else the resource would hold its unit of ``max_live``, or the
        waiter stay counted for other processes, for the rest of the process.
        """
        with contextlib.suppress(OrbitError):
            try:
                step(self._handle)
            except FleetError:  # the handle is closed
                with Pool(self._fleet, kind=self._kind) as own:
                    step(own)


#: Every ledger of this process life, by (fleet object, table kind, key).
_ledgers: Final[dict[tuple[int, int, Key], Ledger[Any]]] = {}
_ledgers_lock = threading.Lock()


def _forget_in_child() -> None:
    """In a forked child the parent's ledgers are the parent's, and a parent thread may
    have held the lock at the fork."""
    global _ledgers_lock  # noqa: PLW0603 - replaced once per fork, as _fork's state is
    _ledgers_lock = threading.Lock()
    _ledgers.clear()


os.register_at_fork(after_in_child=_forget_in_child)
