"""KeyboardInterrupt, CancelledError and other BaseExceptions at every call of a user
callable (``create``, ``check``, ``reset``, ``close``), sync and asyncio; hanging
callables whose caller is cancelled; and a signal's KeyboardInterrupt where the sync
pool blocks.

Each sweep runs its scenario once clean to list the callables' calls, then once per
call with that call raising (or hanging), on a fresh key each time, and checks the
invariant of :mod:`._sweeps` after each run.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Literal

import pytest

from orbitive import Fleet
from orbitive.clients import ClientPool, PoolClosed

from ._injection import BOUND_S, Style, Tracked
from ._sweeps import (
    ASYNC_SCENARIOS,
    SYNC_SCENARIOS,
    Point,
    Scenario,
    Stage,
    SyncScenario,
    invariant_problems,
    run_callback_point,
    run_hang_point,
    staged,
    sweep_calls,
)
from .conftest import Prober

#: What a raising callable raises, by its style.
RAISING: dict[str, tuple[Style, type[BaseException]]] = {
    "coroutine-CancelledError": ("coroutine", asyncio.CancelledError),
    "coroutine-KeyboardInterrupt": ("coroutine", KeyboardInterrupt),
    "thread-KeyboardInterrupt": ("sync", KeyboardInterrupt),
}


@pytest.mark.parametrize("raising", list(RAISING))
@pytest.mark.parametrize("scenario", ASYNC_SCENARIOS, ids=str)
def test_every_callable_call_raising_leaves_the_asyncio_pool_whole(
    fleet: Fleet, prober: Prober, scenario: Scenario, raising: str
) -> None:
    style, error = RAISING[raising]

    def run(at: int) -> Point:
        key = f"{scenario}/{raising}/{at}"
        return run_callback_point(fleet, prober, key, scenario, style, error, at)

    result = sweep_calls(run)
    assert result.count >= 1
    result.check()


@pytest.mark.parametrize("scenario", SYNC_SCENARIOS, ids=str)
def test_every_callable_call_raising_keyboard_interrupt_leaves_the_sync_pool_whole(
    fleet: Fleet, prober: Prober, scenario: SyncScenario
) -> None:
    def run(at: int) -> Point:
        key = f"{scenario}/{at}"
        return run_callback_point(fleet, prober, key, scenario, "sync", KeyboardInterrupt, at)

    result = sweep_calls(run)
    assert result.count >= 1
    result.check()


@pytest.mark.parametrize("canceller", ["wait_for", "cancel"])
@pytest.mark.parametrize("style", ["coroutine", "sync"], ids=["coroutine", "thread"])
@pytest.mark.parametrize("scenario", ASYNC_SCENARIOS, ids=str)
def test_a_hanging_callable_whose_caller_is_cancelled_leaves_the_pool_whole(
    fleet: Fleet,
    prober: Prober,
    scenario: Scenario,
    style: Style,
    canceller: Literal["wait_for", "cancel"],
) -> None:
    """The call hangs until its caller gives up (``asyncio.wait_for`` times out, or the
    caller's task is cancelled once the call hangs), and then returns."""

    def run(at: int) -> Point:
        key = f"{scenario}/{style}/{canceller}/{at}"
        return run_hang_point(fleet, prober, key, scenario, style, canceller, at)

    result = sweep_calls(run, only_while_running=True)
    assert result.count >= 1
    result.check()


class _Interrupt(BaseException):
    """A BaseException of the user's own, as a framework's cancellation could be."""


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit, _Interrupt])
@pytest.mark.parametrize(
    ("scenario", "callable_"),
    [(SYNC_SCENARIOS[1], "check"), (SYNC_SCENARIOS[3], "reset")],
    ids=["check", "reset"],
)
def test_any_base_exception_in_a_sync_check_or_reset_leaks_no_unit(
    fleet: Fleet,
    prober: Prober,
    scenario: SyncScenario,
    callable_: str,
    error: type[BaseException],
) -> None:
    """Issue 19, item 4 (the scenario's first call is the check, or the reset)."""
    point = run_callback_point(fleet, prober, str(scenario), scenario, "sync", error, 1)
    assert point.injected_at == f"call 1 ({callable_})"
    assert point.ended == f"raised {error.__name__}"
    assert not point.problems, point.problems


# -- a signal where the sync pool blocks ----------------------------------------------------


@contextlib.contextmanager
def interrupted_when(condition: Callable[[], bool]) -> Iterator[list[bool]]:
    """Raise KeyboardInterrupt in this (the main) thread from a signal handler as soon as
    ``condition()`` holds, as Ctrl-C would; the list says whether it was raised. A signal
    that lands after the block raises nothing (it would end the test run)."""
    raised: list[bool] = []
    inside = threading.Event()
    inside.set()

    def handler(signum: int, frame: FrameType | None) -> None:
        if inside.is_set():
            raised.append(True)
            raise KeyboardInterrupt

    def watch() -> None:
        deadline = time.monotonic() + BOUND_S
        while not condition():
            if time.monotonic() > deadline or not inside.is_set():
                return
            time.sleep(0.002)
        time.sleep(0.02)  # well inside the wait
        signal.pthread_kill(main, signal.SIGUSR1)

    assert threading.current_thread() is threading.main_thread()
    main = threading.get_ident()
    previous = signal.signal(signal.SIGUSR1, handler)
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield raised
    finally:
        inside.clear()
        watcher.join()
        signal.signal(signal.SIGUSR1, previous)


def _waiting(pool: ClientPool[Tracked]) -> Callable[[], bool]:
    return lambda: pool.statistics().local_waiting > 0


def test_a_keyboard_interrupt_while_getconn_waits_leaves_the_pool_whole(
    fleet: Fleet, prober: Prober
) -> None:
    scenario = SYNC_SCENARIOS[0]
    with staged(fleet, "getconn-waits", "sync", scenario) as stage:
        stage.held += [stage.pool.getconn(), stage.pool.getconn()]  # max_live: it waits
        with interrupted_when(_waiting(stage.pool)) as raised, pytest.raises(KeyboardInterrupt):
            stage.pool.getconn(timeout=BOUND_S)
        assert raised
        assert not invariant_problems(fleet, prober, "getconn-waits", stage)


def _closed(pool: ClientPool[Tracked]) -> bool:
    try:
        pool.statistics()
    except PoolClosed:
        return True
    return False


def test_a_keyboard_interrupt_while_close_waits_leaves_the_pool_whole(
    fleet: Fleet, prober: Prober
) -> None:
    """close() waits for its threads (the closes that returns handed over); interrupted
    there, the client kept idle and the one being closed are closed all the same."""
    scenario = SyncScenario("close-waits", _nothing, _nothing, options={"max_idle": 1})
    with staged(fleet, "close-waits", "sync", scenario) as stage:
        kept, handed_over = stage.pool.getconn(), stage.pool.getconn()
        stage.pool.putconn(kept)
        stage.callbacks.hang_at = 2  # its reset is call 1, its close call 2
        stage.callbacks.arm()
        stage.pool.putconn(handed_over)  # over max_idle: its close hangs in a closing thread
        assert stage.callbacks.hung.wait(BOUND_S)
        assert [call.name for call in stage.callbacks.calls] == ["reset", "close"]
        with interrupted_when(lambda: _closed(stage.pool)) as raised:
            with pytest.raises(KeyboardInterrupt):
                stage.pool.close()
            assert raised
        stage.callbacks.release.set()
        assert not invariant_problems(fleet, prober, "close-waits", stage)


def _nothing(stage: Stage) -> None:
    del stage
