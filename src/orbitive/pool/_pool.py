"""The public pool handle: each verb checks its arguments, then one table step or one delegate."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Final, final

from .._core import _fork
from .._core._errors import FleetError
from .._core._fleet import Fleet
from . import _snapshots
from ._acquire import acquire, budget, snapshot
from ._availability import give_back, take
from ._deaths import DeathWatch, node_dead, reap_dead
from ._execution import CreationPermit, Execution
from ._layout import POOL_KIND
from ._opening import open_table, operations_for
from ._plan import Limits, LocalFirst, Plan, Policy
from ._stats import PoolStatistics, collect
from ._table import Table
from ._values import (
    Candidate,
    Incarnation,
    Key,
    Lease,
    ResourceId,
    check_key,
    check_label,
    check_lease,
    check_rid,
    check_seconds,
    check_units,
)
from ._waiting import Waiting, check_wait

if TYPE_CHECKING:
    from ._fastpath import Operations

_DEFAULT_LIMITS: Final = Limits()
_DEFAULT_POLICY: Final = LocalFirst()


@final
class Pool:
    """This process's handle on the fleet-wide resource table of ``fleet``.

    One SHM object per (fleet, kind) holds every key, resource, reservation and
    creation claim. A process owns the resources it registers (they live in its
    node's lane) and anyone may reserve a unit of any of them; only the owner
    accepts and completes. Nothing but numbers moves between processes.

    Args:
        fleet: a joined (or local) :class:`~orbitive.Fleet`.
        incarnation: this process life; defaults to ``fleet.incarnation``. With
            the default, a forked child adopts its own node and life; with an
            explicit value the child must build its own Pool.
        kind: SHM kind number of the table (default 247).
        key_capacity: keys per epoch; default ``ORBIT_POOL_KEY_CAPACITY`` or 256.
        lane_capacity: resources per node; default
            ``ORBIT_POOL_RESOURCE_LANE_CAPACITY`` or 256.

    Raises:
        MalformedError: a capacity is not a power of two in 1..65536, or this
            process already uses the table with another incarnation or geometry.
        FleetError: the fleet is closed, or an observer without a node.
        LayoutMismatch: the existing object has another layout or is corrupt.
        AccessDenied: the object or lock file is not exclusively ours.

    Example::

        pool = Pool(Fleet.join("web", capacity=8))
        match pool.acquire(key, Limits(max_live=4)):
            case LocalReuse(lease):
                with pool.accept(lease):
                    ...
    """

    def __init__(
        self,
        fleet: Fleet,
        incarnation: Incarnation | None = None,
        *,
        kind: int = POOL_KIND,
        key_capacity: int | None = None,
        lane_capacity: int | None = None,
    ) -> None:
        self._closed = True  # until fully built
        self._table = open_table(fleet, incarnation, kind, key_capacity, lane_capacity)
        self._fleet = fleet
        self._explicit = incarnation is not None
        self._closed = False
        self._attach()

    def _t(self) -> Table:
        if self._fork != _fork.generation or self._closed or self._fleet.closed:
            self._revive()
        return self._table

    def _revive(self) -> None:
        if self._closed or self._fleet.closed:
            what = "pool of fleet" if self._closed else "fleet"
            raise FleetError(f"{what} {self._fleet.name!r} is closed", fleet=self._fleet.name)
        if self._explicit:
            self.close()
            raise FleetError(
                "this Pool was built with an explicit incarnation in the parent process; "
                "build a new Pool with the child's own incarnation",
                fleet=self._fleet.name,
            )
        life = self._fleet.incarnation
        self._table.bind(self._fleet.node, life, life)
        self._attach()

    def _attach(self) -> None:
        """Take this process's waiting machinery and C operations for the bound table."""
        self._fork = _fork.generation
        self._waiting = Waiting.use(self._table)
        self._bind(operations_for(self, self._table))

    def _bind(self, operations: Operations | None) -> None:
        """Make the C operations this pool's own reserve and accept (None: unbind).

        Each then is one C call, which hands anything off its path to
        :meth:`_reserve` or :meth:`_accept_lease`, the Python operations.
        """
        old = self.__dict__.get("_operations")
        if old is not None:
            old.close()
        self._operations = operations
        for name in ("reserve", "accept"):
            if operations is None:
                self.__dict__.pop(name, None)
            else:
                self.__dict__[name] = getattr(operations, name)

    # -- identity ---------------------------------------------------------------------

    @property
    def node(self) -> int:
        """This process's node: the lane its resources live in."""
        return self._t().node

    @property
    def incarnation(self) -> int:
        """This process life, as recorded on its resources and doorbell."""
        return self._t().incarnation

    @property
    def kind(self) -> int:
        """The table's SHM kind number."""
        return self._table.kind

    @property
    def epoch(self) -> int:
        """The table epoch: set at creation, strictly larger after every ``reset_all``."""
        return self._t().epoch()

    # -- acquire ----------------------------------------------------------------------

    def acquire(
        self, key: Key, limits: Limits = _DEFAULT_LIMITS, policy: Policy = _DEFAULT_POLICY
    ) -> Plan:
        """Run one request: snapshot, ask the policy, commit, and return a plan.

        Up to ``limits.attempts`` rounds: take a snapshot of the key (candidates,
        live, creating, version), ask ``policy.decide``, then reserve the chosen
        resource or claim creation budget. A lost race (Busy, Stale, Draining,
        CreationBudget) starts a new round with a fresh snapshot.

        Args:
            key: what the resource must be usable for.
            limits: ``max_live`` (fleet-wide bound of live + creating) and
                ``attempts``.
            policy: a :class:`Policy`; :class:`LocalFirst` by default.

        Returns:
            ``LocalReuse(lease)`` (ours: accept it here), ``RemoteReuse(lease)``
            (carry it to the owner), ``Create(permit)``, ``Wait(version)`` (also
            when the rounds run out) or ``Reject(reason)``.

        Raises:
            MalformedError: bad arguments (a policy that is a class, or has no
                callable ``decide``, too), or the policy returned no Decision.
            KeyFullError: the key table has no room for this key.

        Pool contract: "acquire runs the loop for one request ... and hands back a
        committed Plan". Example::

            match pool.acquire(key, Limits(max_live=4, attempts=4), LocalFirst()):
                case LocalReuse(lease):
                    with pool.accept(lease):
                        use_my_connection()
                case Wait(version):
                    pool.wait_capacity(key, version, timeout=5.0)
        """
        return acquire(self._t(), self.reserve, self.claim_create, key, limits, policy)

    # -- leases -----------------------------------------------------------------------

    def reserve(self, rid: ResourceId) -> Lease:
        """Reserve one unit of ``rid``'s capacity in one atomic table step.

        Never over-admits: after it, ``reserved + active <= capacity``. Anyone may
        reserve, the owner included; the owner must then accept the lease.

        Returns:
            The lease (the fence grows with every reservation on that resource).

        Raises:
            MalformedError: ``rid`` is not an id of this table.
            StaleError: the resource was closed or its slot reused.
            DrainingError: the resource is draining.
            BusyError: no free unit, or all 16 pending entries are taken.
            LayoutMismatch: the slot's fence counter is at 2**64 - 1, which only
                damaged memory holds; nothing is written.
        """
        return self._reserve(rid)

    def _reserve(self, rid: ResourceId) -> Lease:
        if type(rid) is not ResourceId:
            check_rid(rid)  # raises
        table = self._t()
        return Lease(rid, table.reserve(rid), table.node, table.incarnation)

    def cancel_reservation(self, lease: Lease) -> None:
        """The holder takes back a lease it never delivered (transport rollback).

        This is not request cancellation: once the owner accepted, only its
        Execution gives the unit back.

        Raises:
            MalformedError, StaleError: a malformed or stale lease.
            NotOwnerError: another holder's lease.
            NotReservedError: accepted, aged out or cancelled already.
        """
        check_lease(lease)
        self._t().cancel(lease.id, lease.fence, (lease.holder_node, lease.holder_incarnation))

    def accept(self, lease: Lease) -> Execution:
        """Owner turns a lease into an active unit, exactly once per fence.

        Returns:
            An :class:`Execution`; completing it is the only way the unit returns.

        Raises:
            MalformedError: not a lease of this table.
            StaleError: the resource was closed or its slot reused.
            NotOwnerError: this process life does not own the resource.
            DrainingError: the resource is draining.
            NotReservedError: the fence is not pending (a second accept, or the
                owner aged it out, or the holder cancelled it).
            LayoutMismatch: the slot's active count is at 2**32 - 1, which only
                damaged memory holds; the fence stays pending.
        """
        return self._accept_lease(lease)

    def _accept_lease(self, lease: Lease) -> Execution:
        if (
            type(lease) is not Lease
            or type(lease.id) is not ResourceId
            or type(lease.fence) is not int
            or lease.fence <= 0
        ):
            check_lease(lease)  # raises the precise error
        return self._accept(lease.id, lease.fence)

    def _accept(self, rid: ResourceId, fence: int) -> Execution:
        """:meth:`accept` of a fence >= 1; the session codec decodes a frame straight to it."""
        table = self._t()
        return Execution(table, rid, fence, table.accept(rid, fence))

    def _take(self, rid: ResourceId) -> None:
        """The Python operation behind ``Operations.take``: ``_availability.take``."""
        take(self._t(), check_rid(rid))

    def _give_back(
        self, rid: ResourceId, max_idle: int, max_live: int, in_turn: bool, borrowers: bool
    ) -> bool:
        """The Python operation behind ``Operations.give_back``: ``_availability.give_back``.

        Raises:
            MalformedError: not a ResourceId, or a bound is not an int in ``0 .. 2**32 - 1``.
        """
        idle, live = check_units(max_idle, "max_idle", 0), check_units(max_live, "max_live", 0)
        return give_back(self._t(), check_rid(rid), idle, live, in_turn, borrowers)

    # -- resources --------------------------------------------------------------------

    def register(self, key: Key, capacity: int) -> ResourceId:
        """Register a resource this process owns under ``key`` with ``capacity`` units.

        Args:
            key: what it is usable for.
            capacity: 1 for an exclusive resource, more for a multiplexed one.

        Returns:
            Its id; the resource is immediately a live candidate.

        Raises:
            MalformedError: capacity not an int in 1..2**32-1.
            KeyFullError: no room for a new key this epoch.
            LaneFullError: this node's lane has no free slot.
            LayoutMismatch: the table's epoch is 0 (damaged memory; nothing is
                written, and ``reset_all`` mends it).
        """
        check_key(key)
        return self._t().register(key, check_units(capacity, "capacity", 1), 0)

    def register_active(self, key: Key, capacity: int) -> tuple[ResourceId, Execution]:
        """Register a resource with one unit already in use by its owner.

        A fresh exclusive resource is never visible as idle: the first use is
        the returned Execution (fence 0).

        Raises:
            MalformedError, KeyFullError, LaneFullError, LayoutMismatch: as :meth:`register`.
        """
        check_key(key)
        table = self._t()
        rid = table.register(key, check_units(capacity, "capacity", 1), 1)
        return rid, Execution(table, rid, 0, table.locate(rid))

    def unregister(self, rid: ResourceId) -> None:
        """Owner closes the resource; outstanding leases become stale.

        Raises:
            MalformedError, StaleError, NotOwnerError: a malformed, stale or foreign id.
        """
        self._t().close(check_rid(rid))

    def drain(self, rid: ResourceId) -> None:
        """Owner stops new reservations and accepts; running Executions finish normally.

        Raises:
            MalformedError, StaleError, NotOwnerError: a malformed, stale or foreign id.
        """
        self._t().drain(check_rid(rid))

    def reconcile(self, rid: ResourceId, active: int, grace: float) -> int:
        """Owner ages out reservations it never received and states its active count.

        Reservations pending for more than ``grace`` seconds (by the owner's
        clock, never a caller's) are removed; ``active`` replaces the table's
        count of accepted units.

        Args:
            rid: a resource this process owns.
            active: accepted units in use now, an int in ``0 .. 2**32 - 1``.
            grace: seconds, an int or float in ``0 .. 1e9``.

        Returns:
            How many reservations were aged out.

        Raises:
            MalformedError: bad arguments (``grace`` above 1e9 seconds too), or
                ``active`` plus the reservations
                still pending after aging would exceed the capacity (reserve's
                rule, reserved + active <= capacity; nothing changes).
            StaleError, NotOwnerError: a stale or foreign id.
        """
        check_rid(rid)
        active = check_units(active, "active", 0)
        grace_ms = math.ceil(check_seconds(grace, "grace") * 1000.0)
        return self._t().reconcile(rid, active, grace_ms)

    def claim_create(self, key: Key, max_live: int) -> CreationPermit:
        """Claim budget to create a resource for ``key``.

        A claim succeeds only while live + creating resources for the key are
        below ``max_live``, across every process of the fleet, so live resources
        never exceed it. Register the new resource before finishing the permit:
        in between it counts as live and as creating (the reference design's
        conservative overlap), so the sum may read ``max_live + 1`` for that
        moment while every new claim is refused.

        Returns:
            The :class:`CreationPermit`; ``finish()`` it (or leave its ``with``
            block, or drop it) to return the claim.

        Raises:
            MalformedError, KeyFullError: a bad key, or no room to install it.
            CreationBudgetError: live + creating already reached ``max_live``.
        """
        check_key(key)
        max_live = check_units(max_live, "max_live", 1)
        table = self._t()
        return CreationPermit(table, key, table.claim(key, max_live))

    def label_key(self, key: Key, label: str) -> None:
        """Name ``key`` for people: ``orbit pool`` and metrics show the label, not the digest.

        The label is stored in the key's slot, so every process of the fleet,
        and an observer, reads it; the one written last counts, until the
        table's next epoch (``reset_all``) empties the slot.

        Args:
            label: 1..127 bytes of UTF-8 without control characters; put no
                secret in it (every process of the user can read it).

        Raises:
            MalformedError: ``key`` is not a :class:`Key`, or ``label`` breaks the rule.
            KeyFullError: no room to install the key.
        """
        raw = check_label(label)
        self._t().describe(check_key(key), raw, None)

    # -- inspection -------------------------------------------------------------------

    def candidates(self, key: Key) -> list[Candidate]:
        """Every live or draining resource under ``key`` (a snapshot, not a lease)."""
        return snapshot(self._t(), check_key(key), install=False)[0]

    def budget(self, key: Key) -> tuple[int, int]:
        """(live, creating) for ``key``, fleet-wide; installs the key, (0, 0) if full."""
        return budget(self._t(), check_key(key))

    def owners(self) -> list[tuple[int, int]]:
        """Sorted distinct (node, incarnation) owning live or draining resources.

        A damaged slot, whose owner node is not its lane's, counts for nobody.
        """
        return sorted(
            (node, life) for node, lives in _snapshots.lives(self._t()).items() for life in lives
        )

    def version(self, key: Key) -> int:
        """The key's version word: it changes on every completion, close or return.

        Raises:
            KeyFullError: no room to install the key.
        """
        return self._table.changes(self._index(key))

    def statistics(self) -> PoolStatistics:
        """A frozen snapshot of the whole table (what ``orbit pool`` prints)."""
        table = self._t()
        with table:
            return collect(table.buf, table.layout, self._fleet.name)

    # -- waiting ----------------------------------------------------------------------

    def _index(self, key: Key) -> int:
        return self._t().index(check_key(key))

    def wait_capacity(self, key: Key, since: int, timeout: float | None = None) -> int | None:
        """Park this thread until ``key``'s version differs from ``since``.

        A completion, unregister, close, cancelled or aged-out reservation or
        returned claim changes the version. No busy polling: the thread sleeps on
        the version word. Take ``since`` (from ``Wait(version)`` or
        :meth:`version`) *before* trying, so a change in between is not missed.

        Args:
            key: the key to watch.
            since: the version the caller last saw.
            timeout: seconds to wait at most, an int or float in ``0 .. 1e9``
                (about 31.7 years); None waits for ever.

        Returns:
            The new version, or None when ``timeout`` passed first.

        Raises:
            MalformedError: bad arguments (a timeout above 1e9 seconds too).
            KeyFullError: cannot install the key.
        """
        since, seconds = check_wait(since, timeout)
        return self._waiting.wait(self._index(key), since, seconds)

    async def poll_capacity(self, key: Key, since: int, timeout: float | None = None) -> int | None:
        """Asyncio twin of :meth:`wait_capacity` (one readiness descriptor per process).

        Returns:
            The new version, or None when ``timeout`` passed first.

        Raises:
            MalformedError, KeyFullError: as :meth:`wait_capacity`.
        """
        since, seconds = check_wait(since, timeout)
        return await self._waiting.poll(self._index(key), since, seconds)

    def fileno(self) -> int:
        """A descriptor that turns readable after a :meth:`watch` ed key changes.

        It is the same descriptor :meth:`poll_capacity` uses; put it in your own
        ``select``/``selectors`` set, call :meth:`clear_readiness` when it fires,
        and re-arm with :meth:`watch` (interest is one-shot).
        """
        return self._waiting.fileno()

    def watch(self, key: Key) -> int:
        """Arm a one-shot bell on ``key`` for :meth:`fileno`; returns its version now."""
        index = self._index(key)
        return self._waiting.watch(index)

    def clear_readiness(self) -> int:
        """Drain :meth:`fileno`; returns the coalesced count (not a number of changes)."""
        return self._waiting.clear()

    # -- deaths -----------------------------------------------------------------------

    def node_dead(self, node: int, incarnation: int | Incarnation) -> int:
        """Report a confirmed death: close every resource that life of ``node`` owned.

        The node's creation claims are returned too when its doorbell shows that
        incarnation. Another incarnation of the node is untouched. Leases the
        dead process held on others' resources are those owners' to complete.

        Args:
            node: the dead process's node, an int in ``0 .. fleet capacity - 1``.
            incarnation: its life: an int in ``1 .. 2**64 - 1`` (as
                ``fleet.incarnation`` or ``Pool.incarnation`` give it) or an
                :class:`Incarnation` (as passed to ``Pool(fleet, incarnation)``).

        Returns:
            The number of resources closed.

        Raises:
            NodeOutsideFleet: node out of range. MalformedError: ``incarnation``
                is neither such an int (bools refused) nor an Incarnation.
        """
        return node_dead(self._t(), node, incarnation)

    def reap_dead(self) -> list[tuple[int, int]]:
        """Find members that died (their node lock is free, or a newer life holds the
        node) and report each with :meth:`node_dead`.

        A process killed with SIGKILL counts: the kernel frees its node lock. A
        slot whose owner node is not the node of its lane (damaged memory) names
        no life and is skipped; the others are still judged.

        Returns:
            The (node, incarnation) lives reported.
        """
        return reap_dead(self._t(), self._fleet)

    def watch_deaths(
        self,
        interval: float = 1.0,
        on_death: Callable[[int, int], None] | None = None,
    ) -> DeathWatch:
        """Start a thread that calls :meth:`reap_dead` at once, then every ``interval`` seconds.

        The thread keeps watching when ``on_death`` raises or a scan fails; see
        :class:`DeathWatch` for where such exceptions go.

        Args:
            interval: seconds between scans, > 0 and <= 1e9 (and <=
                ``threading.TIMEOUT_MAX``, smaller on some platforms).
            on_death: called with (node, incarnation) for each life reported.

        Returns:
            The running :class:`DeathWatch`; close it (or use ``with``) to stop.

        Raises:
            MalformedError: ``interval`` out of range, or ``on_death`` not callable.
        """
        return DeathWatch(self.reap_dead, interval, on_death)

    # -- lifecycle --------------------------------------------------------------------

    def reset_all(self) -> int:
        """Empty the table and start a new, strictly larger epoch (quiescent boot only).

        Every key and resource is removed, waiters are woken, and every id and
        lease of the old epoch becomes stale. It also mends a damaged epoch: from
        0, and from ``2**64 - 1``, after which no larger epoch exists, the new
        epoch is taken from the wall clock (different, so the old ids are stale
        all the same, but smaller).

        Returns:
            The new epoch, an int in ``1 .. 2**64 - 1``.
        """
        return self._t().reset_all()

    def unlink(self) -> None:
        """Remove the table's SHM name and lock file (a local fleet: ``reset_all``).

        Existing mappings keep working; the next process to open the pool creates
        a new table. Never unlink a table a running fleet uses.

        Raises:
            AccessDenied: the name is no longer ours (another user's object took it).
        """
        table = self._t()
        if table.region.shared:
            table.region.unlink()
        else:
            table.reset_all()

    def close(self) -> None:
        """Release this handle (the last one closes the readiness descriptor). Idempotent.

        The mapping belongs to the fleet and is unmapped by ``fleet.close()``.
        """
        if self._closed:
            return
        self._closed = True
        self._bind(None)
        self._waiting.release()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError(
            "a Pool is bound to this process life and cannot be pickled; "
            "pass the fleet name and build a Pool in the other process"
        )

    def __repr__(self) -> str:
        try:
            table = self._table
            state = (
                "closed" if self._closed else f"node={table.node} incarnation={table.incarnation}"
            )
            return f"<Pool fleet={self._fleet.name!r} kind={table.kind} {state}>"
        except Exception:  # a repr never raises
            return "<Pool (unavailable)>"
