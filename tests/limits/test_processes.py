"""Exactness across processes: 8 processes hitting one key admit exactly the limit,
for each strategy, each child opening the ``shm://`` storage by its URL."""

from __future__ import annotations

import limits
import pytest
from limits.storage import storage_from_string

from .._processes import Processes
from . import _workers

ITEMS = {"fixed": "300/hour", "moving": "300/hour", "sliding": "300/day"}
PROCESSES = 8
TRIES = 100


@pytest.mark.parametrize("strategy", list(ITEMS))
def test_eight_processes_admit_exactly_the_limit(fleet: str, strategy: str) -> None:
    url = f"shm://{fleet}?capacity=64&windows=8&window=512"
    with Processes("fork") as processes:
        children = [
            processes.start(_workers.hammer, url, strategy, ITEMS[strategy], TRIES)
            for _ in range(PROCESSES)
        ]
        for child in children:
            assert child.recv() == "ready"
        for child in children:
            child.send("go")
        admitted = [child.recv(60.0) for child in children]
    assert sum(admitted) == 300, admitted
    limiter = _workers.STRATEGIES[strategy](storage_from_string(url))
    item = limits.parse(ITEMS[strategy])
    assert limiter.get_window_stats(item, "shared").remaining == 0
    assert not limiter.hit(item, "shared")
