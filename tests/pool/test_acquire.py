"""acquire(key, limits, policy): snapshot, decide, commit, retry a lost race, one plan back."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from orbitive._core._errors import MalformedError
from orbitive.pool import (
    Candidate,
    Create,
    CreationPermit,
    Decision,
    Key,
    Lease,
    Limits,
    LocalFirst,
    LocalOnly,
    LocalReuse,
    Plan,
    Policy,
    Pool,
    Reject,
    RemoteReuse,
    ResourceId,
    Wait,
)

from ._agent import Agent, rid_of

KEY = Key.digest(b"redis://cache/0")

Choose = Callable[[Sequence[Candidate], tuple[int, int], Limits], Decision]


def lease_of(plan: Plan, expected: type[LocalReuse | RemoteReuse]) -> Lease:
    """The lease of a LocalReuse or RemoteReuse plan, taken apart with ``match``."""
    match plan:
        case LocalReuse(lease) if expected is LocalReuse:
            return lease
        case RemoteReuse(lease) if expected is RemoteReuse:
            return lease
    raise AssertionError(f"expected {expected.__name__}, got {plan!r}")


def permit_of(plan: Plan) -> CreationPermit:
    """The permit of a Create plan, taken apart with ``match``."""
    match plan:
        case Create(permit):
            return permit
    raise AssertionError(f"expected Create, got {plan!r}")


class Recording:
    """A user policy: records every snapshot and answers with ``choose``."""

    def __init__(self, choose: Choose) -> None:
        self.choose = choose
        self.snapshots: list[tuple[list[Candidate], tuple[int, int], Limits]] = []

    def decide(
        self, key: Key, candidates: Sequence[Candidate], budget: tuple[int, int], limits: Limits
    ) -> Decision:
        assert key == KEY
        self.snapshots.append((list(candidates), budget, limits))
        return self.choose(candidates, budget, limits)


class LoseFirstRace:
    """Wraps a policy; right after its first decision, ``interfere`` makes that decision lose."""

    def __init__(self, inner: Policy, interfere: Callable[[Decision], None]) -> None:
        self.inner = inner
        self.interfere = interfere
        self.snapshots: list[tuple[list[Candidate], tuple[int, int]]] = []

    def decide(
        self, key: Key, candidates: Sequence[Candidate], budget: tuple[int, int], limits: Limits
    ) -> Decision:
        self.snapshots.append((list(candidates), budget))
        decision = self.inner.decide(key, candidates, budget, limits)
        if len(self.snapshots) == 1:
            self.interfere(decision)
        return decision


def _by_id(candidates: list[Candidate], rid: ResourceId) -> Candidate:
    [found] = [c for c in candidates if c.id == rid]
    return found


def test_remote_reuse_for_a_resource_another_process_owns_is_a_committed_lease(
    shm_pool: Pool, agents: Callable[..., Agent]
) -> None:
    owner = agents()
    rid = rid_of(owner.call("register", KEY, 2))
    lease = lease_of(shm_pool.acquire(KEY, Limits(max_live=1), LocalFirst()), RemoteReuse)
    assert (lease.id, lease.fence) == (rid, 1)
    assert (lease.holder_node, lease.holder_incarnation) == (shm_pool.node, shm_pool.incarnation)
    [candidate] = shm_pool.candidates(KEY)
    assert (candidate.local, candidate.reserved) == (False, 1)  # reserved, not just advised
    handle = owner.call("accept", lease)  # the owner takes it as any lease
    assert shm_pool.candidates(KEY)[0].active == 1
    owner.call("complete", handle)
    mine = shm_pool.register(KEY, 1)
    local = lease_of(shm_pool.acquire(KEY, Limits(max_live=2)), LocalReuse)  # LocalFirst default
    assert local.id == mine


def test_local_only_never_reuses_a_remote_resource_it_creates_or_waits(
    shm_pool: Pool, agents: Callable[..., Agent]
) -> None:
    owner = agents()
    remote = rid_of(owner.call("register", KEY, 4))  # free, and the only resource
    permit = permit_of(shm_pool.acquire(KEY, Limits(max_live=2), LocalOnly()))
    assert shm_pool.budget(KEY) == (1, 1)
    permit.finish()
    plan = shm_pool.acquire(KEY, Limits(max_live=1), LocalOnly())
    assert plan == Wait(shm_pool.version(KEY))  # no budget left: wait, not reuse
    mine = shm_pool.register(KEY, 1)
    assert lease_of(shm_pool.acquire(KEY, Limits(max_live=1), LocalOnly()), LocalReuse).id == mine
    plan = shm_pool.acquire(KEY, Limits(max_live=2), LocalOnly())
    assert plan == Wait(shm_pool.version(KEY))  # its own one is busy, the budget spent
    assert _by_id(shm_pool.candidates(KEY), remote).reserved == 0  # never touched
    lease = lease_of(shm_pool.acquire(KEY, Limits(max_live=2), LocalFirst()), RemoteReuse)
    assert lease.id == remote  # the same snapshot under LocalFirst: remote reuse


def test_a_rejecting_policy_gets_reject_with_its_reason_and_commits_nothing(pool: Pool) -> None:
    rid = pool.register(KEY, 1)
    policy = Recording(lambda candidates, budget, limits: Decision.reject("maintenance window"))
    plan = pool.acquire(KEY, Limits(max_live=5, attempts=4), policy)
    match plan:
        case Reject(reason):
            assert reason == "maintenance window"
        case _:
            pytest.fail(f"expected Reject, got {plan!r}")
    assert len(policy.snapshots) == 1  # a refusal is an answer, not a lost race
    assert pool.budget(KEY) == (1, 0)
    assert pool.candidates(KEY)[0].free == 1
    assert pool.reserve(rid).fence == 1  # nothing was reserved in between


def test_a_user_policy_sees_the_snapshot_and_its_choice_is_honoured(
    shm_pool: Pool, agents: Callable[..., Agent]
) -> None:
    first, second = agents(), agents()
    mine = shm_pool.register(KEY, 1)
    theirs = rid_of(first.call("register", KEY, 2))
    chosen = rid_of(second.call("register", KEY, 3))

    def most_units(
        candidates: Sequence[Candidate], budget: tuple[int, int], limits: Limits
    ) -> Decision:
        return Decision.reuse(max(candidates, key=lambda c: c.capacity).id)

    recording = Recording(most_units)
    policy: Policy = recording  # a class of ours meets the protocol
    limits = Limits(max_live=7, attempts=2)
    lease = lease_of(shm_pool.acquire(KEY, limits, policy), RemoteReuse)
    assert lease.id == chosen
    [(candidates, budget, seen_limits)] = recording.snapshots
    assert {c.id for c in candidates} == {mine, theirs, chosen}
    assert [c.id for c in candidates if c.local] == [mine]  # LocalFirst would have taken it
    assert budget == (3, 0)
    assert seen_limits is limits
    second.call("complete", second.call("accept", lease))


@pytest.mark.parametrize("rival", ["reserve", "drain", "unregister"])
def test_a_lost_race_is_retried_with_a_fresh_snapshot(
    shm_pool: Pool, agents: Callable[..., Agent], rival: str
) -> None:
    owner, other = agents(), agents()
    resources = {rid_of(owner.call("register", KEY, 1)) for _ in range(2)}
    lost: list[ResourceId] = []

    def lose(decision: Decision) -> None:  # runs between the snapshot and the commit
        assert decision.id is not None
        lost.append(decision.id)
        if rival == "reserve":
            other.call("reserve", decision.id)  # Busy for us
        else:
            owner.call(rival, decision.id)  # Draining or Stale for us

    policy = LoseFirstRace(LocalFirst(), lose)
    lease = lease_of(shm_pool.acquire(KEY, Limits(max_live=4, attempts=4), policy), RemoteReuse)
    assert len(policy.snapshots) == 2  # one lost round, one won
    assert {lease.id, lost[0]} == resources  # it took the other one
    [first_candidates, _], [second_candidates, _] = policy.snapshots
    assert _by_id(first_candidates, lost[0]).free == 1
    if rival == "unregister":
        assert lost[0] not in {c.id for c in second_candidates}
    else:
        again = _by_id(second_candidates, lost[0])
        assert (again.state, again.reserved) == (
            ("live", 1) if rival == "reserve" else ("draining", 0)
        )
    assert _by_id(shm_pool.candidates(KEY), lease.id).reserved == 1


def test_a_lost_creation_race_is_retried_and_ends_in_wait(
    shm_pool: Pool, agents: Callable[..., Agent]
) -> None:
    rival = agents()
    handles: list[int] = []
    policy = LoseFirstRace(
        LocalFirst(), lambda decision: handles.append(rival.call("claim", KEY, 1))
    )
    plan = shm_pool.acquire(KEY, Limits(max_live=1, attempts=4), policy)
    assert [budget for _, budget in policy.snapshots] == [(0, 0), (0, 1)]
    assert plan == Wait(shm_pool.version(KEY))
    rival.call("drop", handles[0])
    assert shm_pool.budget(KEY) == (0, 0)


@pytest.mark.parametrize("attempts", [1, 3])
def test_rounds_stop_at_limits_attempts_and_answer_wait(
    shm_pool: Pool, agents: Callable[..., Agent], attempts: int
) -> None:
    owner, holder = agents(), agents()
    rid = rid_of(owner.call("register", KEY, 1))
    holder.call("reserve", rid)  # full: every reserve of it loses
    policy = Recording(lambda candidates, budget, limits: Decision.reuse(rid))  # stubborn
    plan = shm_pool.acquire(KEY, Limits(max_live=1, attempts=attempts), policy)
    assert len(policy.snapshots) == attempts  # a fresh snapshot for every round
    assert plan == Wait(shm_pool.version(KEY))
    assert shm_pool.candidates(KEY)[0].reserved == 1  # only the holder's


def test_a_policy_answer_that_is_not_a_decision_is_refused(pool: Pool) -> None:
    class Sloppy:
        def decide(
            self, key: Key, candidates: Sequence[Candidate], budget: tuple[int, int], limits: Limits
        ) -> object:
            return "create"

    with pytest.raises(MalformedError):
        pool.acquire(KEY, Limits(), Sloppy())  # type: ignore[arg-type]  # refused at run time
    assert pool.budget(KEY) == (0, 0)


@pytest.mark.parametrize("policy", [LocalFirst(), LocalOnly()])
def test_a_resource_with_every_pending_entry_taken_is_not_free(pool: Pool, policy: Policy) -> None:
    """16 reservations pending make reserve Busy whatever the capacity: the policy looks on."""
    crowded, roomy = pool.register(KEY, 100), pool.register(KEY, 100)
    pool.reconcile(roomy, 50, grace=60.0)  # more loaded than the crowded one
    leases = [pool.reserve(crowded) for _ in range(16)]
    free = {c.id: (c.reserved, c.free) for c in pool.candidates(KEY)}
    assert free == {crowded: (16, 0), roomy: (0, 16)}
    plan = pool.acquire(KEY, Limits(max_live=2, attempts=1), policy)
    assert isinstance(plan, LocalReuse) and plan.lease.id == roomy
    for lease in [*leases, plan.lease]:
        pool.cancel_reservation(lease)


class _DecideIsNoMethod:
    decide = 5


@pytest.mark.parametrize("policy", [None, 1, "LocalFirst", LocalFirst, _DecideIsNoMethod()])
def test_a_policy_without_a_decide_method_is_refused_before_anything(
    pool: Pool, policy: object
) -> None:
    with pytest.raises(MalformedError, match="policy"):
        pool.acquire(KEY, Limits(), policy)  # type: ignore[arg-type]  # refused at run time
    assert pool.budget(KEY) == (0, 0)


def test_every_plan_kind_from_acquire_works_with_match(
    shm_pool: Pool, agents: Callable[..., Agent]
) -> None:
    def kind(plan: Plan) -> str:
        match plan:
            case LocalReuse(lease):
                return f"LocalReuse fence {lease.fence}"
            case RemoteReuse(lease):
                return f"RemoteReuse fence {lease.fence}"
            case Create(permit):
                permit.finish()
                return "Create"
            case Wait(version):
                return f"Wait {version}"
            case Reject(reason):
                return f"Reject {reason}"
        return "unmatched"

    limits = Limits(max_live=2, attempts=1)
    kinds = [kind(shm_pool.acquire(KEY, limits))]
    agents().call("register", KEY, 1)
    kinds.append(kind(shm_pool.acquire(KEY, limits)))
    shm_pool.register(KEY, 1)
    kinds.append(kind(shm_pool.acquire(KEY, limits)))
    kinds.append(kind(shm_pool.acquire(KEY, limits)))  # both units reserved, budget spent
    kinds.append(kind(shm_pool.acquire(KEY, limits, Recording(lambda *_: Decision.reject("no")))))
    assert kinds == [
        "Create",
        "RemoteReuse fence 1",
        "LocalReuse fence 1",
        f"Wait {shm_pool.version(KEY)}",
        "Reject no",
    ]
