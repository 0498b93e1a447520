"""Exactness across processes: 8 processes (4 sync, 4 asyncio) hitting one key through
each strategy of ``limits`` on ``postgresql://`` admit exactly the limit, no more and
no fewer, and the storage then holds what they did."""

from __future__ import annotations

import pytest
from limits import RateLimitItemPerSecond

from orbitive.limits import PostgresStorage

from .._processes import Processes
from ._pg import pg_url
from ._pg_children import hammer, hit_inherited

__all__ = ["pg_url"]  # fixtures

PROCESSES = 8
LIMIT = 100
HITS = 40  # per process: 320 hits for a limit of 100
#: One window for the whole test: the sliding window counter's windows are aligned on
#: multiples of the expiry, so a short one could end in the middle of the test.
EXPIRY = 1_000_000


@pytest.mark.parametrize("cost", [1, 3])
@pytest.mark.parametrize("strategy", ["fixed-window", "moving-window", "sliding-window-counter"])
def test_eight_processes_hitting_one_key_admit_exactly_the_limit(
    processes: Processes, pg_url: str, strategy: str, cost: int
) -> None:
    forms = ["async", "sync"]
    children = [
        processes.start(hammer, pg_url, forms[n % 2], strategy, LIMIT, EXPIRY, HITS, cost)
        for n in range(PROCESSES)
    ]
    assert [child.recv() for child in children] == ["ready"] * PROCESSES
    for child in children:
        child.send("go")
    admitted = [child.recv(60.0) for child in children]
    assert sum(admitted) == LIMIT // cost, admitted  # of cost 3: 33 hits, 99 of 100 used
    storage = PostgresStorage(pg_url)
    try:
        key = RateLimitItemPerSecond(LIMIT, EXPIRY).key_for("shared")
        used = LIMIT // cost * cost
        if strategy == "fixed-window":
            assert storage.get(key) == PROCESSES * HITS * cost  # every hit counted
        elif strategy == "moving-window":
            assert storage.get_moving_window(key, LIMIT, EXPIRY)[1] == used
        else:
            assert storage.get_sliding_window(key, EXPIRY)[2] == used
    finally:
        storage.close()


def test_a_forked_child_uses_the_inherited_storage_on_a_connection_of_its_own(
    pg_url: str,
) -> None:
    storage = PostgresStorage(pg_url)
    try:
        assert storage.incr("fork", 60) == 1  # the parent's connection is open
        with Processes("fork") as forked:
            child = forked.start(hit_inherited, storage, 5)
            assert child.recv() == [2, 3, 4, 5, 6]
            assert child.wait() == 0
        assert storage.incr("fork", 60) == 7  # the parent's session was left alone
    finally:
        storage.close()
