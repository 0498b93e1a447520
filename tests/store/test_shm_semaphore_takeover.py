"""A semaphore's marker taken over for another limit while clients of both limits acquire
(``store/_shm.py``), one interleaving at a time.

One client's acquisition is stopped before each of its lock-table steps in turn; at the
stop, a client of each limit acquires the same name to the end; then the stopped one
goes on. Whatever the stop, the holders afterwards were granted under one limit, the
marker says that limit, and every refusal names the other limit. The steps are the
engine's own on a real table: the stopped client's table only counts its calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest

from orbitive.store import SemaphoreLease, SemaphoreLimitMismatch, Store, open_store
from orbitive.store._shm import ShmEngine

LONG = 60.0
#: Longest wait for the stopped client's thread to reach its stop or end, in seconds.
PATIENCE_S = 10.0

Outcome = SemaphoreLease | SemaphoreLimitMismatch | None


class StoppedTable:
    """A lock table's calls passed through, the one numbered ``stop`` (from 0) held back
    until :meth:`go`; :attr:`reached` is set when it is."""

    def __init__(self, table: object, stop: int) -> None:
        self._table, self._stop, self._calls = table, stop, 0
        self.reached, self._go = threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._table, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._calls == self._stop:
                self.reached.set()
                assert self._go.wait(PATIENCE_S), "the test never let the call go"
            self._calls += 1
            return attribute(*args, **kwargs)

        return call

    def go(self) -> None:
        self._go.set()


def attempt(store: Store, name: str, limit: int, owner: str) -> Outcome:
    try:
        return store.semaphore(name, limit).try_acquire(owner, LONG)
    except SemaphoreLimitMismatch as error:
        return error


@pytest.fixture
def stores(shm_url: str) -> Iterator[tuple[Store, Store, Store]]:
    """Three clients of one fleet: the one that is stopped, and two others."""
    with open_store(shm_url) as stopped, open_store(shm_url) as one, open_store(shm_url) as two:
        yield stopped, one, two


def stopped_at(
    stopped: Store, stop: int, run: Callable[[], Outcome], meanwhile: Callable[[], None]
) -> tuple[bool, Outcome]:
    """``run`` (an acquisition by ``stopped``) held back before its table call ``stop``
    while ``meanwhile`` runs; whether it got that far, and its outcome."""
    engine = stopped._backend.engine
    assert isinstance(engine, ShmEngine)
    table = engine._table
    gate = StoppedTable(table, stop)
    outcome: list[Outcome] = []
    thread = threading.Thread(target=lambda: outcome.append(run()))
    engine._table = gate  # type: ignore[assignment]
    try:
        thread.start()
        while not gate.reached.wait(0.01) and thread.is_alive():
            pass
        if gate.reached.is_set():
            meanwhile()
        gate.go()
        thread.join(PATIENCE_S)
        assert not thread.is_alive()
    finally:
        engine._table = table
    return gate.reached.is_set(), outcome[0]


def race_at(
    stores: tuple[Store, Store, Store], name: str, stop: int, stopped_limit: int, order: list[int]
) -> tuple[bool, dict[str, tuple[int, Outcome]]]:
    """The stopped client's acquisition held back before its table call ``stop``, the two
    others acquiring in ``order`` of limits meanwhile: whether it got that far, and each
    client's limit and outcome, by owner."""
    stopped, one, two = stores
    outcomes: dict[str, tuple[int, Outcome]] = {}

    def others() -> None:
        for client, limit in zip((one, two), order, strict=True):
            outcomes[f"other-{limit}"] = (limit, attempt(client, name, limit, f"other-{limit}"))

    run = partial(attempt, stopped, name, stopped_limit, "stopped")
    reached, outcome = stopped_at(stopped, stop, run, others)
    outcomes["stopped"] = (stopped_limit, outcome)
    return reached, outcomes


def assert_one_limit(store: Store, name: str, outcomes: dict[str, tuple[int, Outcome]]) -> None:
    """The holders of ``name`` are the granted clients, all of one limit, which the
    marker says; each refusal names the other limit. Then the leases are released."""
    leases = {
        owner: (limit, lease)
        for owner, (limit, lease) in outcomes.items()
        if isinstance(lease, SemaphoreLease)
    }
    holders = store.semaphore(name, 1).holders()
    seen = (name, outcomes, holders)
    assert len({limit for limit, _ in leases.values()}) <= 1, seen
    assert sorted(leases) == sorted(info.owner for info in holders), seen
    assert all(info.limit == leases[info.owner][0] for info in holders), seen
    assert all(info.slot < info.limit for info in holders), seen
    for limit, refused in outcomes.values():
        if isinstance(refused, SemaphoreLimitMismatch):
            assert (refused.limit, refused.found) == (limit, 5 - limit), seen
    for _, lease in leases.values():
        assert lease.release()


@pytest.mark.parametrize("others_first", [2, 3], ids=lambda limit: f"limit-{limit}-first")
@pytest.mark.parametrize(("stopped_limit", "marker_limit"), [(2, 3), (3, 2), (2, 2), (3, 3)])
def test_an_acquisition_stopped_at_any_step_never_mixes_two_limits(
    stores: tuple[Store, Store, Store], stopped_limit: int, marker_limit: int, others_first: int
) -> None:
    """The name was last held under ``marker_limit``: its marker stays, with no holder, so
    a client of the other limit takes it over (the stopped one, or one of the others)."""
    order = sorted((2, 3), key=lambda limit: limit != others_first)
    for stop in range(100):
        name = f"swap-{stop}"
        left = stores[1].semaphore(name, marker_limit).try_acquire("before", LONG)
        assert left is not None and left.release()
        reached, outcomes = race_at(stores, name, stop, stopped_limit, order)
        assert_one_limit(stores[1], name, outcomes)
        if not reached:  # the acquisition ended before this stop: every stop was tried
            assert stop > 2
            return
    raise AssertionError("the acquisition never ended")
