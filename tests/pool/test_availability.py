"""A client pool's return step wakes only the waiters that can take the unit it frees.

An idle client is usable only by its owner's process, or, in remote mode, by any
process that reserves it. Other processes' plain waiters wait for capacity, which
only an unregister returns: a return that keeps the client idle must not wake them
(a fleet at ``max_live`` would otherwise pay a round of every waiter per checkout).
Run with the C operations and with the Python ones (``_bind(None)``), on real
processes.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from orbitive._core._errors import NotOwnerError
from orbitive.pool import Key, Pool
from orbitive.pool._availability import add_waiter
from orbitive.pool._layout import RESOURCE_SIZE

from ._agent import Agent, rid_of
from .test_operations import unit_steps

KEY = Key(0xC11E47)


@pytest.fixture(params=["c", "python"])
def owner(request: pytest.FixtureRequest, shm_pool: Pool) -> Pool:
    if request.param == "python":
        shm_pool._bind(None)
    return shm_pool


def kept_return_changes_version(pool: Pool, borrowers: bool) -> bool:
    """Take the idle client, give it back in turn (kept); whether the key's version moved."""
    take, give_back = unit_steps(pool)
    rid = pool.candidates(KEY)[0].id
    take(rid)
    before = pool.version(KEY)
    assert give_back(rid, 1, 1, True, borrowers) is True  # kept idle: its turn is not over
    return pool.version(KEY) != before


def test_a_kept_return_wakes_no_plain_waiter_of_another_process(
    owner: Pool, agents: Callable[[], Agent]
) -> None:
    owner._t().register(KEY, 1, 0)
    waiter = agents()
    waiter.call("add_waiter", KEY, 1)
    assert not kept_return_changes_version(owner, borrowers=False)
    assert kept_return_changes_version(owner, borrowers=True)  # remote mode: they may reserve it
    waiter.call("add_waiter", KEY, -1)


def test_a_kept_return_wakes_a_waiter_of_its_own_process(owner: Pool) -> None:
    owner._t().register(KEY, 1, 0)
    add_waiter(owner._t(), KEY, 1)
    assert kept_return_changes_version(owner, borrowers=False)
    add_waiter(owner._t(), KEY, -1)


def test_with_nobody_waiting_a_return_changes_nothing_but_the_unit(owner: Pool) -> None:
    owner._t().register(KEY, 1, 0)
    assert not kept_return_changes_version(owner, borrowers=True)


def test_another_live_processs_resource_is_neither_taken_nor_given_back(
    owner: Pool, agents: Callable[[], Agent]
) -> None:
    """Its own id, of this table and kind: refused by name, its slot left as it was."""
    other = agents()
    rid = rid_of(other.call("register", KEY, 2))
    other.call("reserve", rid)  # one unit reserved: a slot with more than its defaults
    take, give_back = unit_steps(owner)
    table = owner._t()
    slot = slice(table.locate(rid), table.locate(rid) + RESOURCE_SIZE)
    before = bytes(table.buf[slot])
    with pytest.raises(NotOwnerError):
        take(rid)
    for max_idle, in_turn, borrowers in [(2, False, False), (0, True, True)]:
        assert give_back(rid, max_idle, 2, in_turn, borrowers) is False
    assert bytes(table.buf[slot]) == before
    (candidate,) = owner.candidates(KEY)
    assert (candidate.reserved, candidate.active) == (1, 0)


def test_a_return_whose_turn_is_over_goes_to_a_waiter_holding_fewer_clients(
    owner: Pool, agents: Callable[[], Agent]
) -> None:
    """max_live 2 over three processes: one holding none waits, the other two hold one each
    and have waiters of their own. Were a turn-over client kept for its owner's waiter
    (within the fair share, which floors at one), the third would wait for ever."""
    _, give_back = unit_steps(owner)
    table = owner._t()
    rid = table.register(KEY, 1, 1)  # ours, in use
    other, starved = agents(), agents()
    other.call("register", KEY, 1)
    starved.call("add_waiter", KEY, 1)
    add_waiter(table, KEY, 1)  # a caller of ours waits too
    assert give_back(rid, 2, 2, False, False) is False  # handed over: closed for the waiter
    owner.unregister(rid)
    starved.call("add_waiter", KEY, -1)
    other.call("add_waiter", KEY, 1)  # now the waiter elsewhere holds as many as we do
    again = table.register(KEY, 1, 1)
    assert give_back(again, 2, 2, False, False) is True  # kept: our waiter takes it
    add_waiter(table, KEY, -1)
    other.call("add_waiter", KEY, -1)
