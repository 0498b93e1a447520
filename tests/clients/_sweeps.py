"""The cancellation and interrupt layer: scenarios, one injection, the invariant, sweeps.

A *scenario* prepares a pool (a client idle, one checked out, the pool closed...)
and runs one public operation on it. A *point* is one place where something is
injected into that operation: an await (a task suspending, or another task finishing)
or a call of a user callable. A *sweep* runs the scenario once clean, to count its
points, and then once per point, each time with a fresh key of the test's fleet.

After every injection the pool must settle (:func:`invariant_problems`):

1. within :data:`SETTLE_S`, the key has no client in use (but those the test holds),
   no creation claim and no waiter fleet-wide, at most ``max_live`` live clients, and
   every client the pool created is idle in it or closed; the same once the test has
   given its clients back;
2. no client was closed twice (a close that ended cancelled may be called again: it
   may have closed nothing), and no callable ran on a closed client;
3. ``max_live`` clients can be checked out at once in this process (through the pool,
   or a new pool of the key if it is closed);
4. once the pool is closed, every client it created was closed exactly once and the
   key has no live client left;
5. then ``max_live`` clients can be checked out at once in another process (the
   session's prober: :class:`.conftest.Prober`).

The points must be the same on every run: the loop's steps may not depend on thread
timing. :class:`._injection.StepExecutor` sees to it for the loop's worker threads; a
sweep checks it (the clean run counts as many points as the sweep reaches).

A point's problems are collected, not raised at once, so one test reports every
point that leaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from orbitive import Fleet
from orbitive.clients import ClientPool, ClientPoolStatistics, PoolClosed, PoolOptions

from ._injection import (
    SUSPENSIONS,
    AwaitInjection,
    Call,
    Callbacks,
    Injector,
    Ledger,
    StepExecutor,
    Style,
    Tracked,
)
from .conftest import Prober

#: The key's host-wide budget in every scenario.
MAX_LIVE: Final = 2

#: Seconds a scenario's own checkouts may wait (only the waiting scenario waits).
CHECKOUT_S: Final = 2.0

#: Seconds the pool may take to settle after an injection.
SETTLE_S: Final = 2.0

#: Seconds of the waits after a point has already failed.
SHORT_WAIT_S: Final = 0.2

#: Seconds a hanging callable's caller first waits before ``asyncio.wait_for`` gives
#: up; a run the timeout ended before its hang (or, in the clean run, before it
#: returned) is run again on a fresh pool with four times the timeout.
HANG_TIMEOUT_S: Final = 0.02

#: The longest ``asyncio.wait_for`` timeout a hang point tries.
HANG_TIMEOUT_MOST_S: Final = 6.0

#: A sweep gives up past this many points (a scenario that never completes).
MOST_POINTS: Final = 200

#: Turns of the loop with no task but the driver's before a run counts as done.
QUIET_TURNS: Final = 3


# -- scenarios ----------------------------------------------------------------------------


@dataclass
class Stage:
    """What a scenario works on: the pool, its callables, the clients the test holds."""

    pool: ClientPool[Tracked]
    callbacks: Callbacks
    held: list[Tracked] = field(default_factory=list)
    background: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def ended(self) -> bool:
        """Whether the operation under test has ended."""
        return self.callbacks.operation_ended

    def end(self) -> None:
        self.callbacks.operation_ended = True


@dataclass(frozen=True)
class Scenario:
    """One public operation on a prepared pool (``prepare`` runs disarmed).

    ``failing``: callables that fail their own way while armed (``check`` returns
    False, ``reset`` raises RuntimeError), so that the operation discards or retires.
    """

    name: str
    prepare: Callable[[Stage], Awaitable[None]]
    operation: Callable[[Stage], Awaitable[object]]
    failing: frozenset[str] = frozenset()
    options: Mapping[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class SyncScenario:
    """The sync twin of :class:`Scenario`."""

    name: str
    prepare: Callable[[Stage], None]
    operation: Callable[[Stage], object]
    failing: frozenset[str] = frozenset()
    options: Mapping[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.name


async def _nothing(stage: Stage) -> None:
    del stage


async def _one_idle(stage: Stage) -> None:
    await stage.pool.putconn_async(await stage.pool.getconn_async())


async def _two_idle(stage: Stage) -> None:
    first = await stage.pool.getconn_async()
    second = await stage.pool.getconn_async()
    await stage.pool.putconn_async(first)
    await stage.pool.putconn_async(second)


async def _one_out(stage: Stage) -> None:
    stage.held.append(await stage.pool.getconn_async())


async def _one_out_then_closed(stage: Stage) -> None:
    stage.held.append(await stage.pool.getconn_async())
    await stage.pool.close_async()


async def _all_out_and_a_returner(stage: Stage) -> None:
    """``max_live`` clients out, and a task (not under test) that returns one as soon as
    the operation waits for it."""
    for _ in range(MAX_LIVE):
        stage.held.append(await stage.pool.getconn_async())
    stage.background.append(asyncio.ensure_future(_return_one_to_the_waiter(stage)))


async def _return_one_to_the_waiter(stage: Stage) -> None:
    while not stage.pool.statistics().local_waiting:
        if stage.ended:
            return
        await asyncio.sleep(0)
    stage.callbacks.disarm()  # the test's own return, not the operation's
    try:
        await stage.pool.putconn_async(stage.held.pop())
    finally:
        stage.callbacks.arm()


async def _getconn(stage: Stage) -> Tracked:
    return await stage.pool.getconn_async(timeout=CHECKOUT_S)


async def _putconn(stage: Stage) -> None:
    await stage.pool.putconn_async(stage.held.pop())


async def _discard(stage: Stage) -> None:
    await stage.pool.discard_async(stage.held.pop())


async def _client(stage: Stage) -> None:
    async with stage.pool.client_async(timeout=CHECKOUT_S):
        pass


async def _close(stage: Stage) -> None:
    await stage.pool.close_async()


CHECK_FAILS: Final = frozenset({"check"})
RESET_FAILS: Final = frozenset({"reset"})
NO_IDLE: Final = {"max_idle": 0}  # every return closes its client, off the caller's path

#: The asyncio operations, from every state they can start in.
ASYNC_SCENARIOS: Final = (
    Scenario("getconn_async-creates", _nothing, _getconn),
    Scenario("getconn_async-checks-idle", _one_idle, _getconn),
    Scenario("getconn_async-check-fails", _one_idle, _getconn, CHECK_FAILS),
    Scenario("getconn_async-waits", _all_out_and_a_returner, _getconn),
    Scenario("putconn_async-keeps", _one_out, _putconn),
    Scenario("putconn_async-reset-fails", _one_out, _putconn, RESET_FAILS),
    Scenario("putconn_async-hands-over", _one_out, _putconn, options=NO_IDLE),
    Scenario("putconn_async-after-close", _one_out_then_closed, _putconn),
    Scenario("discard_async", _one_out, _discard),
    Scenario("client_async", _one_idle, _client),
    Scenario("close_async", _two_idle, _close),
)


def _nothing_sync(stage: Stage) -> None:
    del stage


def _one_idle_sync(stage: Stage) -> None:
    stage.pool.putconn(stage.pool.getconn())


def _two_idle_sync(stage: Stage) -> None:
    first, second = stage.pool.getconn(), stage.pool.getconn()
    stage.pool.putconn(first)
    stage.pool.putconn(second)


def _one_out_sync(stage: Stage) -> None:
    stage.held.append(stage.pool.getconn())


def _one_out_then_closed_sync(stage: Stage) -> None:
    stage.held.append(stage.pool.getconn())
    stage.pool.close()


def _getconn_sync(stage: Stage) -> Tracked:
    return stage.pool.getconn(timeout=CHECKOUT_S)


def _putconn_sync(stage: Stage) -> None:
    stage.pool.putconn(stage.held.pop())


def _discard_sync(stage: Stage) -> None:
    stage.pool.discard(stage.held.pop())


def _client_sync(stage: Stage) -> None:
    with stage.pool.client(timeout=CHECKOUT_S):
        pass


def _close_sync(stage: Stage) -> None:
    stage.pool.close()


#: The sync operations, from every state they can start in.
SYNC_SCENARIOS: Final = (
    SyncScenario("getconn-creates", _nothing_sync, _getconn_sync),
    SyncScenario("getconn-checks-idle", _one_idle_sync, _getconn_sync),
    SyncScenario("getconn-check-fails", _one_idle_sync, _getconn_sync, CHECK_FAILS),
    SyncScenario("putconn-keeps", _one_out_sync, _putconn_sync),
    SyncScenario("putconn-reset-fails", _one_out_sync, _putconn_sync, RESET_FAILS),
    SyncScenario("putconn-hands-over", _one_out_sync, _putconn_sync, options=NO_IDLE),
    SyncScenario("putconn-after-close", _one_out_then_closed_sync, _putconn_sync),
    SyncScenario("discard", _one_out_sync, _discard_sync),
    SyncScenario("client", _one_idle_sync, _client_sync),
    SyncScenario("close", _two_idle_sync, _close_sync),
)


# -- one point ----------------------------------------------------------------------------


@dataclass
class Point:
    """What one run of a scenario did."""

    ended: str  # how the operation ended: "returned", "cancelled", "raised X"
    calls: list[Call]  # the callables' calls while armed
    points: int  # await points counted (async runs)
    injected_at: str | None = None  # where the injection landed; None: not reached
    marks: set[tuple[str, int]] = field(default_factory=set)
    jobs: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)


@contextlib.contextmanager
def staged(
    fleet: Fleet, key: str, style: Style, scenario: Scenario | SyncScenario
) -> Iterator[Stage]:
    """A fresh pool of ``key`` with callables of ``style``; closed (disarmed) afterwards."""
    callbacks = Callbacks(Ledger(), style, scenario.failing)
    options = PoolOptions(
        max_live=MAX_LIVE, acquire_timeout=CHECKOUT_S, handoff_uses=1, **scenario.options
    )
    pool = callbacks.pool(fleet, key, options)
    stage = Stage(pool, callbacks)
    try:
        yield stage
    finally:
        callbacks.disarm()
        callbacks.release.set()
        pool.close()


def outcome_of(task: asyncio.Task[Any] | None) -> str:
    if task is None or not task.done():
        return "never finished"
    if task.cancelled():
        return "cancelled"
    error = task.exception()
    return "returned" if error is None else f"raised {type(error).__name__}"


def unlogged(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's exception handler: drop "exception was never retrieved" reports.

    The injected errors leave such tasks and futures behind by design, and the default
    handler would format their tracebacks in whichever thread collects them: CPython
    3.11 formats with ``ast.parse``, which is not safe beside another thread's parse.
    """
    del loop, context


async def _drive_await_point(
    stage: Stage, scenario: Scenario, injector: Injector, hold: bool
) -> None:
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(unlogged)
    executor = StepExecutor(injector, hold)
    loop.set_default_executor(executor)
    stage.callbacks.injector = injector
    await scenario.prepare(stage)
    injector.install(loop)
    stage.callbacks.arm()
    target = injector.start(scenario.operation(stage))
    await asyncio.wait({target})
    stage.end()
    executor.release_held()
    await _other_tasks_done()
    injector.stop()
    loop.set_task_factory(None)


async def _other_tasks_done() -> None:
    """Let the tasks the operation started (a create, a close) run to their end, and
    the ones a callback starts once another ends (a close once a check ends): the loop
    must see no other task for a few turns in a row."""
    deadline = time.monotonic() + SETTLE_S
    me = asyncio.current_task()
    quiet = 0
    while quiet < QUIET_TURNS and time.monotonic() < deadline:
        busy = any(task is not me for task in asyncio.all_tasks())
        quiet = 0 if busy else quiet + 1
        await asyncio.sleep(0.001)


def run_await_point(
    fleet: Fleet,
    prober: Prober,
    key: str,
    scenario: Scenario,
    style: Style,
    injection: AwaitInjection,
    at: int,
    hold: bool,
) -> Point:
    """Run ``scenario`` with ``injection`` at await point ``at`` (0: none), then check it."""
    injector = Injector(injection, at)
    with staged(fleet, key, style, scenario) as stage:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_drive_await_point(stage, scenario, injector, hold))
        stage.end()
        point = Point(
            outcome_of(injector.target),
            list(stage.callbacks.calls),
            injector.points,
            injector.injected_at,
            injector.marks_at_points,
            injector.jobs_at_points,
        )
        _keep_result(stage, injector.target)
        point.problems = invariant_problems(fleet, prober, key, stage)
    return point


def _keep_result(stage: Stage, task: asyncio.Task[Any] | None) -> None:
    """A client the operation returned is the test's to give back."""
    if task is not None and task.done() and not task.cancelled() and task.exception() is None:
        result = task.result()
        if isinstance(result, Tracked):
            stage.held.append(result)


def run_callback_point(
    fleet: Fleet,
    prober: Prober,
    key: str,
    scenario: Scenario | SyncScenario,
    style: Style,
    raising: type[BaseException],
    at: int,
) -> Point:
    """Run ``scenario`` with its ``at``-th callable call raising ``raising`` (0: none)."""
    with staged(fleet, key, style, scenario) as stage:
        stage.callbacks.raise_at = at or None
        stage.callbacks.raising = raising
        if isinstance(scenario, SyncScenario):
            ended = _run_sync(stage, scenario)
        else:
            ended = _run_async(stage, scenario, _plain)
        return _checked(fleet, prober, key, stage, ended, at)


def run_hang_point(
    fleet: Fleet,
    prober: Prober,
    key: str,
    scenario: Scenario,
    style: Style,
    canceller: Literal["wait_for", "cancel"],
    at: int,
) -> Point:
    """Run ``scenario`` with its ``at``-th callable call hanging until its caller is
    cancelled (``asyncio.wait_for`` timing out, or ``task.cancel()`` once it hangs).

    A ``wait_for`` whose timeout came before the hang (a slow machine) cancelled the
    operation somewhere else: that run is checked, then run again with a longer
    timeout, so the point lands where it was aimed however loaded the machine is.
    """
    timeout, attempt = HANG_TIMEOUT_S, 0
    while True:
        run_key = f"{key}/{attempt}" if attempt else key
        with staged(fleet, run_key, style, scenario) as stage:
            stage.callbacks.hang_at = at or None
            if canceller == "wait_for":
                waiting: Runner = functools.partial(_timed_out, timeout=timeout)
            else:
                waiting = _cancelled_when_hung
            ended = _run_async(stage, scenario, waiting)
            point = _checked(fleet, prober, run_key, stage, ended, at)
            aimed = stage.callbacks.hung.is_set() if at else ended != "raised TimeoutError"
        if aimed or point.problems or canceller != "wait_for" or timeout >= HANG_TIMEOUT_MOST_S:
            return point
        timeout, attempt = timeout * 4, attempt + 1


def _checked(fleet: Fleet, prober: Prober, key: str, stage: Stage, ended: str, at: int) -> Point:
    """The point's invariant; the calls are counted after it (a close handed to a
    closing thread is called while the pool settles)."""
    problems = invariant_problems(fleet, prober, key, stage)
    calls = list(stage.callbacks.calls)
    injected = f"call {at} ({calls[at - 1].name})" if 0 < at <= len(calls) else None
    return Point(ended, calls, 0, injected, problems=problems)


def _run_sync(stage: Stage, scenario: SyncScenario) -> str:
    scenario.prepare(stage)
    stage.callbacks.arm()
    try:
        result = scenario.operation(stage)
    except BaseException as error:  # the injected one, or what the pool made of it
        return f"raised {type(error).__name__}"
    finally:
        stage.end()
    if isinstance(result, Tracked):
        stage.held.append(result)
    return "returned"


Runner = Callable[[Stage, Awaitable[object]], Awaitable[object]]


async def _plain(stage: Stage, operation: Awaitable[object]) -> object:
    del stage
    return await operation


async def _timed_out(stage: Stage, operation: Awaitable[object], timeout: float) -> object:
    del stage
    return await asyncio.wait_for(operation, timeout)


async def _cancelled_when_hung(stage: Stage, operation: Awaitable[object]) -> object:
    task = asyncio.ensure_future(operation)
    while not task.done() and not stage.callbacks.hung.is_set():
        await asyncio.sleep(0.001)
    task.cancel()
    return await task


def _run_async(stage: Stage, scenario: Scenario, runner: Runner) -> str:
    async def drive() -> str:
        asyncio.get_running_loop().set_exception_handler(unlogged)
        await scenario.prepare(stage)
        stage.callbacks.arm()
        try:
            result = await runner(stage, scenario.operation(stage))
        except KeyboardInterrupt:
            raise  # it leaves the loop, which cancels what is left
        except BaseException as error:  # the injected one, or what the pool made of it
            ended = f"raised {type(error).__name__}"
        else:
            ended = "returned"
            if isinstance(result, Tracked):
                stage.held.append(result)
        finally:
            stage.end()
            stage.callbacks.release.set()
        await _other_tasks_done()
        return ended

    try:
        return asyncio.run(drive())
    except KeyboardInterrupt:
        return "raised KeyboardInterrupt"


# -- the invariant ------------------------------------------------------------------------


def invariant_problems(fleet: Fleet, prober: Prober, key: str, stage: Stage) -> list[str]:
    """What is wrong with the pool after an injection (the module docstring's list).

    Once the pool has failed to settle, the checkouts at once are not tried (a unit
    that never came back makes them time out) and the later waits are short: a failing
    point costs about :data:`SETTLE_S`, not several timeouts.
    """
    holding = len(stage.held)
    problems = settled(fleet, key, stage, holding, SETTLE_S)
    stage.callbacks.disarm()
    stage.callbacks.release.set()
    problems += give_back(stage)
    problems += settled(fleet, key, stage, 0, SHORT_WAIT_S if problems else SETTLE_S)
    whole = not problems
    problems += stage.callbacks.ledger.problems
    if whole:
        problems += _at_once_here(fleet, key, stage)
    problems += _closed_once(fleet, key, stage, SHORT_WAIT_S if problems else SETTLE_S)
    if whole:
        refused = prober.probe(key, MAX_LIVE, CHECKOUT_S)
        if refused is not None:
            problems.append(f"another process could not check out {MAX_LIVE} at once: {refused}")
    else:
        problems.append("(the checkouts at once were not tried)")
    return problems


def give_back(stage: Stage) -> list[str]:
    """Return the clients the test holds (a pool closed meanwhile closes them)."""

    async def back() -> None:
        while stage.held:
            await stage.pool.putconn_async(stage.held.pop())

    try:
        asyncio.run(back())
    except BaseException as error:  # reported: the test goes on to the rest of the checks
        return [f"giving back a held client raised {error!r}"]
    return []


def key_statistics(fleet: Fleet, key: str, stage: Stage) -> ClientPoolStatistics:
    """The key's statistics through the stage's pool, or, once it is closed, through a
    pool of its own (fleet-wide figures only, then)."""
    with contextlib.suppress(PoolClosed):
        return stage.pool.statistics()
    return observed(fleet, key)


def observed(fleet: Fleet, key: str) -> ClientPoolStatistics:
    """The key's statistics through a new pool of the key that checks nothing out."""
    spare = Callbacks(Ledger(), "sync")
    with spare.pool(fleet, key, PoolOptions(max_live=MAX_LIVE)) as observer:
        return observer.statistics()


def key_live(fleet: Fleet, key: str) -> int:
    """The key's live clients fleet-wide."""
    return observed(fleet, key).live


def settled(fleet: Fleet, key: str, stage: Stage, holding: int, bound: float) -> list[str]:
    """Wait (at most ``bound`` seconds) until only the ``holding`` clients the test holds
    are in use, and every other client the pool created is idle in it or closed."""
    deadline = time.monotonic() + bound
    while True:
        stats = key_statistics(fleet, key, stage)
        unclosed = len(stage.callbacks.ledger.unclosed())
        wrong = _unsettled(stats, holding, unclosed)
        if not wrong or time.monotonic() >= deadline:
            break
        time.sleep(0.005)
    return [f"not settled within {bound} s: {', '.join(wrong)}"] if wrong else []


def _unsettled(stats: ClientPoolStatistics, holding: int, unclosed: int) -> list[str]:
    """What keeps the key from having settled (a closed pool's ``stats`` are another
    pool's: no idle client of its own, as the closed pool should have none)."""
    wrong = []
    if stats.in_use != holding:
        wrong.append(f"in use {stats.in_use} (the test holds {holding})")
    if stats.creating:
        wrong.append(f"creating {stats.creating}")
    if stats.waiting:
        wrong.append(f"waiting {stats.waiting}")
    if stats.live > MAX_LIVE:
        wrong.append(f"live {stats.live} > max_live {MAX_LIVE}")
    if unclosed != stats.local_idle + holding:
        wrong.append(
            f"{unclosed} clients unclosed, but {stats.local_idle} idle "
            f"and {holding} held by the test"
        )
    return wrong


def _at_once_here(fleet: Fleet, key: str, stage: Stage) -> list[str]:
    """``max_live`` clients checked out at once in this process (a closed pool: through a
    new pool of the key)."""

    async def take_all(pool: ClientPool[Tracked]) -> None:
        clients: list[Tracked] = []
        try:
            for _ in range(MAX_LIVE):
                clients.append(await pool.getconn_async(timeout=CHECKOUT_S))
        finally:
            for client in clients:
                await pool.putconn_async(client)

    try:
        try:
            asyncio.run(take_all(stage.pool))
        except PoolClosed:
            spare = Callbacks(Ledger(), "sync")
            with spare.pool(fleet, key, PoolOptions(max_live=MAX_LIVE)) as other:
                asyncio.run(take_all(other))
    except Exception as error:
        return [f"this process could not check out {MAX_LIVE} at once: {error!r}"]
    return []


def _closed_once(fleet: Fleet, key: str, stage: Stage, bound: float) -> list[str]:
    """Close the pool: every client it created closed exactly once, and (within ``bound``
    seconds) none live."""
    problems = []
    try:
        stage.pool.close()
    except BaseException as error:  # reported: the count below still runs
        problems.append(f"close() raised {error!r}")
    unclosed = stage.callbacks.ledger.unclosed()
    if unclosed:
        problems.append(f"after close() {len(unclosed)} clients never closed: {unclosed}")
    deadline = time.monotonic() + bound
    while (live := key_statistics(fleet, key, stage).live) and time.monotonic() < deadline:
        time.sleep(0.005)
    if live:
        problems.append(f"after close() {live} clients of the key still live")
    return problems


# -- sweeps -------------------------------------------------------------------------------


@dataclass
class Sweep:
    """Every point of one scenario and what went wrong at each."""

    clean: Point
    points: list[Point] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.points)

    def failures(self) -> list[str]:
        """One line per point with problems (the clean run's first)."""
        lines = [f"clean run: {'; '.join(self.clean.problems)}"] if self.clean.problems else []
        lines += [
            f"point {number} at {point.injected_at} ({point.ended}): {'; '.join(point.problems)}"
            for number, point in enumerate(self.points, 1)
            if point.problems
        ]
        return lines

    def check(self) -> None:
        """Raise AssertionError listing every point that failed (none: nothing)."""
        failures = self.failures()
        if failures:
            raise AssertionError(
                f"{len(failures)} of {self.count} points failed:\n  " + "\n  ".join(failures)
            )


def sweep_await_points(run: Callable[[int], Point]) -> Sweep:
    """Run point 0 (clean), then points 1, 2, ... until one is not reached: the
    operation (and what it started) completed before it."""
    result = Sweep(run(0))
    for at in range(1, MOST_POINTS + 1):
        point = run(at)
        if point.injected_at is None:
            return result
        result.points.append(point)
    raise AssertionError(f"more than {MOST_POINTS} points: the scenario never completes")


def sweep_calls(run: Callable[[int], Point], only_while_running: bool = False) -> Sweep:
    """Run point 0 (clean), then once per call of a user callable it made (with
    ``only_while_running``, the calls made while the operation ran)."""
    result = Sweep(run(0))
    for at, call in enumerate(result.clean.calls, 1):
        if only_while_running and not call.while_target_runs:
            continue
        point = run(at)
        if point.injected_at != f"call {at} ({call.name})":
            raise AssertionError(f"call {at} was {call.name} in the clean run: {point}")
        result.points.append(point)
    return result


def uncovered(result: Sweep, style: Style, injection: AwaitInjection) -> set[object]:
    """The callables' suspensions (coroutines) or worker-thread calls (sync callables)
    of the clean run at which no point of the sweep injected.

    For a cancel, only the calls made while the operation ran count: what its tasks do
    after it returned is no longer its caller's to cancel.
    """
    calls = [c for c in result.clean.calls if injection == "interrupt" or c.while_target_runs]
    if style == "coroutine":
        expected: set[object] = {(c.name, n) for c in calls for n in range(SUSPENSIONS)}
        hit: set[object] = set().union(*(point.marks for point in result.points))
    else:
        expected = {c.name for c in calls if c.in_thread}
        hit = set().union(*(point.jobs for point in result.points))
    return expected - hit
