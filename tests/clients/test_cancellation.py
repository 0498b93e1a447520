"""Cancellation and KeyboardInterrupt at every await point of the asyncio client pool.

Each test sweeps one scenario (:data:`._sweeps.ASYNC_SCENARIOS`): it runs it once
clean to count its points, then once per point with the injection there, on a fresh
key each time, and checks the invariant of :mod:`._sweeps` after each run. A point
is every suspension of every task of the loop while the operation runs (its own
awaits, a create or close task it started), and for a cancel also such a task
finishing: ``task.cancel()`` on the operation's task there, or ``KeyboardInterrupt``
thrown into the suspending task.

The callables suspend a known number of times (coroutines) or run in worker threads
held at known points (sync callables: finished before the loop awaits them, or held
inside the callable until the operation has ended), so the points are the same on
every run, and the test checks that every suspension of every callable was one.
"""

from __future__ import annotations

import pytest

from orbitive import Fleet

from ._injection import AwaitInjection, Style
from ._sweeps import (
    ASYNC_SCENARIOS,
    Point,
    Scenario,
    run_await_point,
    sweep_await_points,
    uncovered,
)
from .conftest import Prober

#: (callable style, hold the worker thread at the injection point)
CALLABLES: dict[str, tuple[Style, bool]] = {
    "coroutine": ("coroutine", False),
    "thread-finished": ("sync", False),
    "thread-held": ("sync", True),
}


@pytest.mark.parametrize("injection", ["cancel", "interrupt"])
@pytest.mark.parametrize("callables", list(CALLABLES))
@pytest.mark.parametrize("scenario", ASYNC_SCENARIOS, ids=str)
def test_every_await_point_leaves_the_pool_whole(
    fleet: Fleet, prober: Prober, scenario: Scenario, callables: str, injection: AwaitInjection
) -> None:
    style, hold = CALLABLES[callables]

    def run(at: int) -> Point:
        key = f"{scenario}/{callables}/{injection}/{at}"
        return run_await_point(fleet, prober, key, scenario, style, injection, at, hold)

    result = sweep_await_points(run)
    assert result.count == result.clean.points, "the points differ from run to run"
    assert not uncovered(result, style, injection), "a callable's await was no point"
    result.check()
