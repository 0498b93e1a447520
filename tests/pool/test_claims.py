"""Creation claims: live + creating never exceeds max_live, across processes."""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest

from orbitive._core._errors import CreationBudgetError
from orbitive.pool import Create, Key, Limits, LocalFirst, LocalReuse, Pool, Wait

from ._agent import Agent

KEY = Key.digest(b"postgres://db/main")


def test_eight_processes_claim_with_max_live_three_exactly_three_succeed(
    shm_pool: Pool, agents: Callable[[], Agent]
) -> None:
    members = [agents() for _ in range(8)]
    for member in members:
        member.send("claim", KEY, 3)  # all in flight at once
    won, refused = [], 0
    for member in members:
        try:
            won.append((member, member.reply()))
        except CreationBudgetError:
            refused += 1
    assert (len(won), refused) == (3, 5)
    assert shm_pool.budget(KEY) == (0, 3)
    for member, handle in won:
        member.call("drop", handle)  # permits are returned on drop
    assert shm_pool.budget(KEY) == (0, 0)
    assert shm_pool.claim_create(KEY, 3) is not None


def test_registration_counts_live_while_the_permit_still_counts_creating(pool: Pool) -> None:
    permit = pool.claim_create(KEY, 2)
    assert pool.budget(KEY) == (0, 1)
    pool.register(KEY, 1)
    assert pool.budget(KEY) == (1, 1)  # conservative overlap
    with pytest.raises(CreationBudgetError):
        pool.claim_create(KEY, 2)
    permit.finish()
    permit.finish()  # idempotent
    assert pool.budget(KEY) == (1, 0)
    with pool.claim_create(KEY, 2):
        assert pool.budget(KEY) == (1, 1)
    assert pool.budget(KEY) == (1, 0)


def test_dropped_permit_returns_its_claim(pool: Pool) -> None:
    permit = pool.claim_create(KEY, 1)
    assert pool.budget(KEY) == (0, 1)
    del permit
    gc.collect()
    assert pool.budget(KEY) == (0, 0)


def test_acquire_creates_then_reuses_then_waits(pool: Pool) -> None:
    limits = Limits(max_live=1, attempts=2)
    plan = pool.acquire(KEY, limits, LocalFirst())
    assert isinstance(plan, Create)
    rid, execution = pool.register_active(KEY, 1)
    plan.permit.finish()
    waiting = pool.acquire(KEY, limits)
    assert isinstance(waiting, Wait)
    assert waiting.version == pool.version(KEY)
    execution.complete()
    match pool.acquire(KEY, limits):
        case LocalReuse(lease):
            assert lease.id == rid
        case other:
            pytest.fail(f"expected LocalReuse of our own resource, got {other}")
