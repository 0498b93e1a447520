"""kill -9 inside a table step: the next step rolls the journal back, and the counts stay
exact (the dead process's own hit counted or not, never more) and usable (no wedge)."""

from __future__ import annotations

import os
import random
import signal
import time

import limits
import pytest
from limits.storage import storage_from_string

from orbitive.limits import ShmStorage

from .._processes import Child, Processes
from . import _workers

#: (strategy, point, hits before the fatal one): every place a step can die.
POINTS = [
    ("fixed", "journaled", 0),
    ("fixed", "written", 0),
    ("sliding", "journaled", 0),
    ("sliding", "written", 0),
    ("moving", "stamped", 0),
    ("moving", "journaled", 0),
    ("moving", "written", 0),
    ("moving", "stamped", 3),
]
ITEM = "10/hour"


@pytest.mark.parametrize(("strategy", "point", "before"), POINTS)
def test_a_process_killed_inside_a_step_leaves_its_hit_uncounted(
    fleet: str, strategy: str, point: str, before: int
) -> None:
    url = f"shm://{fleet}?capacity=64&windows=8&window=16"
    storage = storage_from_string(url)
    assert isinstance(storage, ShmStorage)
    limiter, item = _workers.STRATEGIES[strategy](storage), limits.parse(ITEM)
    for _ in range(before):
        assert limiter.hit(item, "shared")
    rollbacks = storage.table.rollbacks()
    with Processes("fork") as processes:
        child = processes.start(_workers.die_inside, url, strategy, ITEM, point)
        assert child.wait() == -signal.SIGKILL
    # The next step repairs the section (EOWNERDEAD) and rolls the journal back.
    assert limiter.get_window_stats(item, "shared").remaining == 10 - before
    journaled = point != "stamped"
    assert storage.table.rollbacks() == rollbacks + journaled
    assert sum(limiter.hit(item, "shared") for _ in range(20)) == 10 - before


def _drain(child: Child) -> int:
    """Admitted hits the child reported and the test has not read yet."""
    connection = child.channel._conn
    admitted = 0
    while True:
        try:
            if not connection.poll(0):
                return admitted
            message = connection.recv()
        except (EOFError, OSError):
            return admitted
        admitted += message == 1


@pytest.mark.parametrize(
    ("strategy", "item", "window"),
    [
        ("fixed", "1000000/hour", 16),
        ("moving", "60000/hour", 65536),
        ("sliding", "1000000/day", 16),
    ],
)
def test_children_killed_at_random_while_hammering_leave_exact_counts(
    fleet: str, strategy: str, item: str, window: int
) -> None:
    url = f"shm://{fleet}?capacity=64&windows=2&window={window}"
    rng = random.Random(os.getpid())
    reported = kills = 0
    with Processes("fork") as processes:
        children = []
        for _ in range(3):
            children.append(processes.start(_workers.hammer_until_killed, url, strategy, item))
            assert children[-1].recv() == "ready"
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.001, 0.03))
            victim = children.pop(rng.randrange(len(children)))
            victim.kill()
            kills += 1
            reported += _drain(victim)
            for child in children:
                reported += _drain(child)
            children.append(processes.start(_workers.hammer_until_killed, url, strategy, item))
            assert children[-1].recv() == "ready"
        for child in children:
            child.kill()
            kills += 1
            reported += _drain(child)
    limiter, parsed = _workers.STRATEGIES[strategy](storage_from_string(url)), limits.parse(item)
    counted = parsed.amount - limiter.get_window_stats(parsed, "shared").remaining
    # A killed child may have been counted without reporting it (killed between the
    # step and its send), never counted twice, never more than one hit per kill.
    assert reported <= counted <= reported + kills, (reported, counted, kills)
    assert reported > 0
    # The table goes on counting exactly.
    before = counted
    assert all(limiter.hit(parsed, "shared") for _ in range(50))
    assert parsed.amount - limiter.get_window_stats(parsed, "shared").remaining == before + 50
