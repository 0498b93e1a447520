"""Deaths: a member killed with SIGKILL gives its resources and claims back once reported."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

import pytest

from orbitive import Fleet
from orbitive._core._errors import MalformedError, NodeOutsideFleet, StaleError
from orbitive.pool import Create, DeathWatch, Incarnation, Key, Limits, Pool, Wait

from .._children import lock_table_member
from .._processes import Processes
from ._agent import Agent, explicit_life_member, rid_of
from .conftest import CAPACITY

KEY = Key.digest(b"https://api.example")


def _kill(agent: Agent) -> None:
    agent.process.kill()
    agent.process.join(10.0)
    assert agent.process.exitcode == -9


def test_sigkilled_owner_resources_gone_after_report_peer_intact_next_acquire_creates(
    shm_pool: Pool, agents: Callable[[], Agent]
) -> None:
    doomed, peer = agents(), agents()
    doomed_rid = rid_of(doomed.call("register", KEY, 1))
    doomed.call("accept", shm_pool.reserve(doomed_rid))  # mid-lease when killed
    doomed.call("claim", KEY, 3)
    peer_rid, peer_handle = peer.call("register_active", KEY, 1)
    assert shm_pool.budget(KEY) == (2, 1)
    limits = Limits(max_live=2)
    assert isinstance(shm_pool.acquire(KEY, limits), Wait)
    _kill(doomed)
    assert shm_pool.reap_dead() == [(doomed.node, doomed.incarnation)]
    assert [c.id for c in shm_pool.candidates(KEY)] == [peer_rid]
    assert shm_pool.budget(KEY) == (1, 0)  # its resource closed, its claim returned
    assert shm_pool.owners() == [(peer.node, peer.incarnation)]
    plan = shm_pool.acquire(KEY, limits)
    assert isinstance(plan, Create)
    plan.permit.finish()
    peer.call("complete", peer_handle)
    assert shm_pool.candidates(KEY)[0].free == 1  # the peer's resource is intact
    assert shm_pool.reap_dead() == []  # reported once


def test_node_dead_for_another_incarnation_leaves_resources_intact(
    shm_pool: Pool, agents: Callable[[], Agent]
) -> None:
    member = agents()
    member.call("register", KEY, 1)
    member.call("claim", KEY, 5)
    assert shm_pool.node_dead(member.node, member.incarnation + 1) == 0
    assert shm_pool.budget(KEY) == (1, 1)
    assert shm_pool.reap_dead() == []  # alive: nothing to report
    assert shm_pool.node_dead(member.node, member.incarnation) == 1
    assert shm_pool.budget(KEY) == (0, 0)
    with pytest.raises(NodeOutsideFleet):
        shm_pool.node_dead(10_000, 1)


def test_node_dead_takes_an_incarnation_object_as_well_as_an_int(
    shm_pool: Pool, agents: Callable[[], Agent]
) -> None:
    member = agents()
    rid = rid_of(member.call("register", KEY, 1))
    member.call("claim", KEY, 5)
    assert shm_pool.node_dead(member.node, Incarnation(member.incarnation + 1)) == 0
    assert shm_pool.budget(KEY) == (1, 1)  # another life: untouched
    for bad in (True, "1", 1.0, None, member.incarnation.to_bytes(8, "little")):
        with pytest.raises(MalformedError):
            shm_pool.node_dead(member.node, bad)  # type: ignore[arg-type]  # refused at run time
    assert shm_pool.budget(KEY) == (1, 1)
    assert shm_pool.node_dead(member.node, Incarnation(member.incarnation)) == 1
    assert shm_pool.budget(KEY) == (0, 0)  # its resource closed, its claim returned
    with pytest.raises(StaleError):
        member.call("reserve", rid)  # the member itself sees the resource gone
    assert shm_pool.node_dead(member.node, Incarnation(member.incarnation)) == 0  # once


def test_death_watch_reports_a_killed_member_without_a_supervisor(
    shm_pool: Pool, agents: Callable[[], Agent]
) -> None:
    member = agents()
    member.call("register", KEY, 2)
    seen: list[tuple[int, int]] = []
    with shm_pool.watch_deaths(interval=0.05, on_death=lambda n, i: seen.append((n, i))) as watch:
        _kill(member)
        deadline = time.monotonic() + 10.0
        while not seen and time.monotonic() < deadline:
            time.sleep(0.02)
    assert seen == [(member.node, member.incarnation)] == watch.reported
    assert shm_pool.candidates(KEY) == []


def test_death_watch_scans_at_once_not_after_its_first_interval(
    shm_pool: Pool, agents: Callable[[], Agent]
) -> None:
    member = agents()
    member.call("register", KEY, 2)
    _kill(member)  # dead before the watch starts
    with shm_pool.watch_deaths(interval=3600.0) as watch:
        _until(lambda: bool(watch.reported))
    assert watch.reported == [(member.node, member.incarnation)]
    assert shm_pool.candidates(KEY) == []


def _until(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10.0
    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.fixture
def hooked(monkeypatch: pytest.MonkeyPatch) -> list[BaseException | None]:
    """What reaches ``threading.excepthook`` during the test (instead of stderr)."""
    seen: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    return seen


def test_death_watch_keeps_reporting_after_on_death_raises(
    shm_pool: Pool, agents: Callable[[], Agent], hooked: list[BaseException | None]
) -> None:
    first, second = agents(), agents()
    for member in (first, second):
        member.call("register", KEY, 1)

    def on_death(node: int, incarnation: int) -> None:
        raise KeyError(node)

    with shm_pool.watch_deaths(interval=0.05, on_death=on_death) as watch:
        _kill(first)
        _until(lambda: len(watch.reported) == 1)
        _kill(second)
        _until(lambda: len(watch.reported) == 2)
    assert watch.reported == [(first.node, first.incarnation), (second.node, second.incarnation)]
    assert [type(error) for error in hooked] == [KeyError, KeyError] and watch.failures == 2
    assert shm_pool.candidates(KEY) == []


def test_death_watch_outlives_a_failing_scan_and_calls_every_life(
    hooked: list[BaseException | None],
) -> None:
    scans: list[object] = [RuntimeError("scan"), [(1, 11), (2, 22)], [(3, 33)]]

    def reap() -> list[tuple[int, int]]:
        step = scans.pop(0) if scans else []
        if isinstance(step, Exception):
            raise step
        assert isinstance(step, list)
        return step

    called: list[tuple[int, int]] = []

    def on_death(node: int, incarnation: int) -> None:
        called.append((node, incarnation))
        if node == 1:
            raise ValueError("a bug in the callback")

    with DeathWatch(reap, 0.01, on_death) as watch:
        _until(lambda: len(called) == 3)
    assert called == watch.reported == [(1, 11), (2, 22), (3, 33)]
    assert [type(error) for error in hooked] == [RuntimeError, ValueError]


@pytest.mark.parametrize(
    "interval", [0, -1.0, math.nan, math.inf, 1e300, threading.TIMEOUT_MAX * 2, True, "1"]
)
def test_watch_deaths_refuses_an_interval_it_cannot_wait(pool: Pool, interval: object) -> None:
    with pytest.raises(MalformedError, match="interval"):
        pool.watch_deaths(interval)  # type: ignore[arg-type]  # refused at run time


def test_watch_deaths_refuses_an_on_death_that_is_not_callable(pool: Pool) -> None:
    with pytest.raises(MalformedError, match="on_death"):
        pool.watch_deaths(1.0, 5)  # type: ignore[arg-type]  # refused at run time


def test_a_new_life_on_a_dead_nodes_lane_takes_back_its_claims(
    shm_pool: Pool, agents: Callable[[], Agent]
) -> None:
    doomed = agents()
    doomed.call("claim", KEY, 5)
    doomed.call("register", KEY, 1)
    _kill(doomed)
    successor = agents()  # claims the lowest free node: the dead one's
    assert successor.node == doomed.node
    assert shm_pool.budget(KEY) == (1, 0)  # its predecessor's claim went back at bind
    assert shm_pool.reap_dead() == [(doomed.node, doomed.incarnation)]
    assert shm_pool.budget(KEY) == (0, 0)


def test_a_life_whose_node_a_process_without_a_pool_took_is_over(
    shm_pool: Pool, shm_fleet: Fleet, agents: Callable[[], Agent]
) -> None:
    """The node's doorbell still shows the dead life (nobody bound a pool since), but the
    membership object's incarnation of the node is the new process's: the old life is over."""
    doomed = agents()
    doomed.call("claim", KEY, 5)
    doomed.call("register", KEY, 1)
    _kill(doomed)
    with Processes("fork") as started:
        member = started.start(lock_table_member, shm_fleet.name, CAPACITY)
        node, incarnation = member.recv()
        assert node == doomed.node and incarnation > doomed.incarnation
        assert shm_pool.budget(KEY) == (1, 1)  # its claim and its resource are still listed
        assert shm_pool.reap_dead() == [(doomed.node, doomed.incarnation)]
        assert shm_pool.budget(KEY) == (0, 0)
        assert shm_pool.reap_dead() == []  # the new member's own life is not reported


def test_a_live_member_with_an_explicit_incarnation_is_not_reported(
    shm_pool: Pool, fleet_name: str
) -> None:
    """A pool life need not be the fleet's incarnation; its process holds the node all the same."""
    with Processes("fork") as started:
        member = started.start(explicit_life_member, fleet_name, CAPACITY, KEY)
        node, life = member.recv()
        assert shm_pool.owners() == [(node, life)]
        assert shm_pool.reap_dead() == []
        assert shm_pool.budget(KEY) == (1, 0)
