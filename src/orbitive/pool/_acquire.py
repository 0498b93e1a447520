"""The acquire loop: snapshot a key, ask the policy, commit its decision, as one request.

A round reads a snapshot of the key (candidates, live, creating, version), asks
``policy.decide`` and commits the :class:`~._plan.Decision` it returns: a
reservation for ``reuse``, a creation claim for ``create``. A race lost between
the snapshot and the commit (Busy, Stale, Draining, CreationBudget) ends the
round; the next one starts from a fresh snapshot. When the rounds run out the
answer is :class:`~._plan.Wait`, so a caller never spins here.

:func:`snapshot` is that read on its own, for ``Pool.candidates`` and
``Pool.budget`` as well.
"""

from __future__ import annotations

from collections.abc import Callable

from .._core._errors import (
    BusyError,
    CreationBudgetError,
    DrainingError,
    KeyFullError,
    MalformedError,
    StaleError,
    shown,
)
from . import _snapshots
from ._execution import CreationPermit
from ._plan import Create, Decision, Limits, LocalReuse, Plan, Policy, Reject, RemoteReuse, Wait
from ._table import Table
from ._values import Candidate, Key, Lease, ResourceId, check_key


def acquire(
    table: Table,
    reserve: Callable[[ResourceId], Lease],
    claim: Callable[[Key, int], CreationPermit],
    key: Key,
    limits: Limits,
    policy: Policy,
) -> Plan:
    """:meth:`Pool.acquire` on ``table``, committing through the pool's ``reserve`` and
    ``claim_create``: check, then at most ``limits.attempts`` rounds (raises as it says)."""
    check_key(key)
    if type(limits) is not Limits:
        raise MalformedError(f"limits must be Limits, got {type(limits).__name__}")
    if isinstance(policy, type) or not callable(_decide_of(policy)):
        raise MalformedError(f"policy must be an object with a decide method, got {shown(policy)}")
    version = 0
    for _ in range(limits.attempts):
        candidates, live, creating, version = snapshot(table, key, install=True)
        decision = policy.decide(key, candidates, (live, creating), limits)
        plan = _commit(table, reserve, claim, key, decision, limits, version)
        if plan is not None:
            return plan
    return Wait(version)


def snapshot(table: Table, key: Key, *, install: bool) -> tuple[list[Candidate], int, int, int]:
    """(candidates, live, creating, version) of ``key``; all empty when it is not installed."""
    found = _snapshots.snapshot(table, key, install)
    return ([], 0, 0, 0) if found is None else found


def budget(table: Table, key: Key) -> tuple[int, int]:
    """(live, creating) of ``key`` from a snapshot that installs it; (0, 0) if there is no room."""
    try:
        _, live, creating, _ = snapshot(table, key, install=True)
    except KeyFullError:
        return 0, 0
    return live, creating


def _decide_of(policy: object) -> object:
    """``policy.decide``, or None when reading it fails in any way (a hostile ``__getattr__``)."""
    try:
        return getattr(policy, "decide", None)
    except Exception:
        return None


def _commit(
    table: Table,
    reserve: Callable[[ResourceId], Lease],
    claim: Callable[[Key, int], CreationPermit],
    key: Key,
    decision: Decision,
    limits: Limits,
    version: int,
) -> Plan | None:
    """The plan ``decision`` commits to, or None when a race was lost (another round)."""
    if type(decision) is not Decision:
        raise MalformedError(f"a policy must return a Decision, got {shown(decision)}")
    if decision.action == "reuse" and decision.id is not None:
        try:
            lease = reserve(decision.id)
        except (BusyError, StaleError, DrainingError):
            return None
        mine = table.owner(decision.id) == (table.node, table.incarnation)
        return LocalReuse(lease) if mine else RemoteReuse(lease)
    if decision.action == "create":
        try:
            return Create(claim(key, limits.max_live))
        except CreationBudgetError:
            return None
    if decision.action == "wait":
        return Wait(version)
    if decision.action == "reject":
        return Reject(decision.reason)
    raise MalformedError(f"a policy returned an incomplete decision {shown(decision)}")
