"""Fault injection for the client pool: user callables that raise or hang, and injection
at every suspension of an event loop's tasks.

* :class:`Ledger` and :class:`Tracked`: fake clients that count their closes and report
  a use after close, so a test can say "every client created is idle or closed once".
* :class:`Callbacks`: ``create``, ``check``, ``reset`` and ``close`` for a
  :class:`~orbitive.clients.ClientPool`, plain (``style="sync"``, run in the caller's
  thread or, by the asyncio paths, in a worker thread) or coroutine functions that
  suspend :data:`SUSPENSIONS` times each. While armed they number their calls, and the
  j-th call can raise or hang.
* :class:`Injector`: a task factory that counts every suspension of every task of a
  loop (and every task that finishes) and, at the k-th, cancels the task under test or
  throws ``KeyboardInterrupt`` into the suspending task, as a signal landing there would.
* :class:`StepExecutor`: the loop's default executor, so that the callables run in
  worker threads reach known points before the loop goes on: a job has finished before
  the loop awaits it, or, at the injection point, is held inside the callable until the
  operation under test has ended.

Together they make the enumeration deterministic: the loop's order of steps does not
depend on thread timing, so "the k-th point" names one place in the operation.
No test framework is imported here.
"""

from __future__ import annotations

import asyncio
import collections.abc
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Final, Literal

from orbitive import Fleet
from orbitive.clients import ClientPool, PoolOptions

#: Suspensions of each coroutine callable (``await asyncio.sleep(0)`` each).
SUSPENSIONS: Final = 2

#: Generous bound on anything the machinery waits for (a held job, a started thread).
BOUND_S: Final = 10.0

#: What an injection at an await point does.
AwaitInjection = Literal["cancel", "interrupt"]

#: How a pool's callables are made.
Style = Literal["sync", "coroutine"]


class Tracked:
    """A fake client: its serial, how many times ``close`` was called on it, and how many
    of those calls ended cancelled (cut off: they may have closed nothing)."""

    def __init__(self, serial: int) -> None:
        self.serial = serial
        self.close_calls = 0
        self.cut_off_closes = 0

    @property
    def closes(self) -> int:
        """The closes that ended (returned or raised), not cut off."""
        return self.close_calls - self.cut_off_closes

    def __repr__(self) -> str:
        return f"<Tracked {self.serial} closes={self.close_calls}>"


class Ledger:
    """Every client one pool created, and what went wrong with them (a second close,
    a use after close)."""

    def __init__(self) -> None:
        self.created: list[Tracked] = []
        self.problems: list[str] = []
        self._lock = threading.Lock()

    def create(self) -> Tracked:
        with self._lock:
            client = Tracked(len(self.created) + 1)
            self.created.append(client)
        return client

    def use(self, client: Tracked, what: str) -> None:
        if client.close_calls:
            self.problems.append(f"{what}() ran on client {client.serial} after its close")

    def close(self, client: Tracked) -> None:
        """A close call starts. A second one is a problem unless every one before it was
        cut off: a coroutine close that ends cancelled may have closed nothing, and the
        pool then closes the client again (``_retiring``)."""
        with self._lock:
            client.close_calls += 1
            if client.close_calls - client.cut_off_closes > 1:
                self.problems.append(f"client {client.serial} closed {client.close_calls} times")

    def cut_off(self, client: Tracked) -> None:
        """A coroutine close of ``client`` ended cancelled."""
        with self._lock:
            client.cut_off_closes += 1

    def unclosed(self) -> list[Tracked]:
        with self._lock:
            return [client for client in self.created if client.closes == 0]


# -- the callables --------------------------------------------------------------------


@dataclass
class Call:
    """One call of a user callable while armed."""

    name: str
    in_thread: bool  # run by the asyncio paths in a worker thread (StepExecutor's job)
    while_target_runs: bool  # the operation under test had not finished yet


class Callbacks:
    """``create``/``check``/``reset``/``close`` over a :class:`Ledger`.

    Disarmed they just work. Armed (:meth:`arm`): every call is numbered in
    :attr:`calls`; the call numbered ``raise_at`` raises ``raising`` at its entry, the
    one numbered ``hang_at`` waits for :attr:`release` (:attr:`hung` is set once it
    waits); a callable named in ``failing`` fails its own way (``check`` returns False,
    ``reset`` raises RuntimeError).
    """

    def __init__(self, ledger: Ledger, style: Style, failing: frozenset[str] = frozenset()):
        self.ledger = ledger
        self.style = style
        self.failing = failing
        self.injector: Injector | None = None
        self.operation_ended = False  # set by the test once the operation under test ended
        self.calls: list[Call] = []
        self.raise_at: int | None = None
        self.raising: type[BaseException] = KeyboardInterrupt
        self.hang_at: int | None = None
        self.hung = threading.Event()
        self.release = threading.Event()
        self._armed = False

    def pool(self, fleet: Fleet, key: str, options: PoolOptions) -> ClientPool[Tracked]:
        """A ClientPool of ``key`` over these callables."""
        if self.style == "sync":
            return ClientPool(
                fleet, key, self.create, self.close,
                check=self.check, reset=self.reset, options=options,
            )  # fmt: skip
        return ClientPool(
            fleet, key, self.create_async, self.close_async,
            check=self.check_async, reset=self.reset_async, options=options,
        )  # fmt: skip

    def arm(self) -> None:
        self._armed = True

    def disarm(self) -> None:
        self._armed = False

    def _enter(self, name: str) -> bool:
        """Number an armed call; raise if it is the one; True if it is to hang."""
        if not self._armed:
            return False
        job = current_job()
        if self.injector is None:
            running = not self.operation_ended
        else:
            running = self.injector.target_running()
        self.calls.append(Call(name, job is not None, running))
        number = len(self.calls)
        if number == self.raise_at:
            raise self.raising
        if job is not None:
            job.entered(name)
        return number == self.hang_at

    def _hang(self) -> None:
        self.hung.set()
        self.release.wait(BOUND_S)

    async def _hang_async(self) -> None:
        self.hung.set()
        while not self.release.is_set():
            await asyncio.sleep(0.002)

    def _fails(self, name: str) -> bool:
        return self._armed and name in self.failing

    # -- sync --------------------------------------------------------------------------

    def create(self) -> Tracked:
        if self._enter("create"):
            self._hang()
        return self.ledger.create()

    def check(self, client: Tracked) -> bool:
        if self._enter("check"):
            self._hang()
        self.ledger.use(client, "check")
        return not self._fails("check")

    def reset(self, client: Tracked) -> None:
        if self._enter("reset"):
            self._hang()
        self.ledger.use(client, "reset")
        if self._fails("reset"):
            raise RuntimeError("reset failed")

    def close(self, client: Tracked) -> None:
        try:
            hang = self._enter("close")
        finally:
            self.ledger.close(client)  # called is closed: a close that raises is not retried
        if hang:
            self._hang()

    # -- coroutine -----------------------------------------------------------------------

    async def _visit(self, name: str) -> None:
        """Enter as the sync twin does, then suspend as :meth:`_suspend` says."""
        await self._suspend(name, self._enter(name))

    async def _suspend(self, name: str, hang: bool) -> None:
        """Hang if told to, then suspend SUSPENSIONS times, marking each for the injector."""
        if hang:
            await self._hang_async()
        for number in range(SUSPENSIONS):
            if self.injector is not None:
                self.injector.mark(name, number)
            try:
                await asyncio.sleep(0)
            finally:
                if self.injector is not None:
                    self.injector.unmark()

    async def create_async(self) -> Tracked:
        await self._visit("create")
        return self.ledger.create()

    async def check_async(self, client: Tracked) -> bool:
        await self._visit("check")
        self.ledger.use(client, "check")
        return not self._fails("check")

    async def reset_async(self, client: Tracked) -> None:
        await self._visit("reset")
        self.ledger.use(client, "reset")
        if self._fails("reset"):
            raise RuntimeError("reset failed")

    async def close_async(self, client: Tracked) -> None:
        try:
            try:
                hang = self._enter("close")
            finally:
                self.ledger.close(client)
            await self._suspend("close", hang)
        except asyncio.CancelledError:
            self.ledger.cut_off(client)
            raise


# -- the points of a loop ---------------------------------------------------------------


class Injector:
    """Counts the points of the tasks created after :meth:`install` and injects at one.

    A point is a task's suspension (any task: the operation's own, a task it started
    for a create or a close) or, for ``"cancel"``, also a task other than the target
    finishing. Counting starts with the target's first step.

    * ``"cancel"``: at point ``at`` the target task is cancelled (``task.cancel()``, as
      ``asyncio.wait_for`` or an ASGI server does). Points are counted while the target
      runs.
    * ``"interrupt"``: at point ``at`` ``KeyboardInterrupt`` is thrown into the
      suspending task at its await, as a signal's handler raising there would; it
      leaves the event loop. Points are counted until :meth:`stop`.

    ``at=0`` injects nothing: a clean run, which counts the points.
    """

    def __init__(self, kind: AwaitInjection, at: int) -> None:
        self.kind = kind
        self.at = at
        self.points = 0
        self.target: asyncio.Task[Any] | None = None
        self.injected_at: str | None = None  # where the injection landed
        self.marks_at_points: set[tuple[str, int]] = set()  # coroutine callables' suspensions
        self.jobs_at_points: set[str] = set()  # callables of worker-thread jobs
        self.running: Counted | None = None
        self._marks: dict[asyncio.Task[Any] | None, tuple[str, int]] = {}
        self._step_job: Job | None = None
        self._stopped = False

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.set_task_factory(self._factory)

    def _factory(
        self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any
    ) -> asyncio.Task[Any]:
        return asyncio.Task(Counted(coro, self), loop=loop, **kwargs)

    def start(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        """Start the target task (after :meth:`install`)."""
        self.target = asyncio.ensure_future(work)
        return self.target

    def stop(self) -> None:
        """Count no more points (the run is over)."""
        self._stopped = True

    def target_running(self) -> bool:
        return self.target is not None and not self.target.done() and not self._stopped

    def _counting(self) -> bool:
        if self._stopped:
            return False
        return self.kind == "interrupt" or self.target_running()

    def mark(self, name: str, number: int) -> None:
        """The running task's coroutine callable ``name`` suspends for the ``number``-th time."""
        self._marks[asyncio.current_task()] = (name, number)

    def unmark(self) -> None:
        self._marks.pop(asyncio.current_task(), None)

    def step_started(self, counted: Counted) -> None:
        self.running = counted
        self._step_job = None

    def step_finished(self) -> None:
        self.running = None

    def submitted(self, job: Job) -> None:
        """The running step handed ``job`` to a worker thread."""
        if self.running is not None:
            self._step_job = job

    def next_point_is_the_one(self) -> bool:
        """Whether the step running now ends at the injection point (if it suspends)."""
        return self.running is not None and self._counting() and self.points + 1 == self.at

    def step_ended(self, counted: Counted, suspended: bool) -> BaseException | None:
        """A counted task's step ended; the error to throw into it there, if any."""
        if not self._counting():
            return None
        if not suspended and (self.kind == "interrupt" or asyncio.current_task() is self.target):
            return None  # a finishing task is a point only for a cancel of another task
        self.points += 1
        if self.points != self.at:
            return None
        mark = self._marks.get(asyncio.current_task())
        if mark is not None:
            self.marks_at_points.add(mark)
        if self._step_job is not None:
            self.jobs_at_points.update(self._step_job.callables)
        self.injected_at = counted.describe() + ("" if suspended else " (finished)")
        if self.kind == "interrupt":
            return KeyboardInterrupt(f"injected at point {self.at}")
        assert self.target is not None
        self.target.cancel(f"injected at point {self.at}")
        return None


class Counted(collections.abc.Coroutine[Any, Any, Any]):
    """A task's coroutine, passed through, that reports each step's end to the injector."""

    def __init__(self, inner: collections.abc.Coroutine[Any, Any, Any], injector: Injector):
        self._inner = inner
        self._injector = injector

    def send(self, value: Any) -> Any:
        return self._step(self._inner.send, value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if val is None and tb is None:
            return self._step(self._inner.throw, typ)
        return self._step(lambda _: self._inner.throw(typ, val, tb), None)

    def close(self) -> None:
        self._inner.close()

    def __await__(self) -> Generator[Any, None, Any]:
        return self._inner.__await__()

    def _step(self, resume: Callable[[Any], Any], argument: Any) -> Any:
        injector = self._injector
        injector.step_started(self)
        try:
            while True:
                try:
                    yielded = resume(argument)
                except BaseException:  # StopIteration included: the task finishes
                    injector.step_ended(self, suspended=False)
                    raise
                error = injector.step_ended(self, suspended=True)
                if error is None:
                    return yielded
                resume, argument = self._inner.throw, error
        finally:
            injector.step_finished()

    def describe(self) -> str:
        """The awaits the coroutine is suspended in, outermost first (asyncio's left out)."""
        names: list[str] = []
        frame: Any = self._inner
        while frame is not None:
            code = getattr(frame, "cr_code", None) or getattr(frame, "gi_code", None)
            if code is None:
                break
            if "asyncio" not in code.co_filename:
                names.append(code.co_name)
            frame = getattr(frame, "cr_await", None) or getattr(frame, "gi_yieldfrom", None)
        return " > ".join(names)


# -- worker threads at known points -----------------------------------------------------


class Job:
    """One callable the loop runs in a worker thread."""

    def __init__(self, hold: bool) -> None:
        self.hold = hold
        self.callables: list[str] = []
        self.settled = threading.Event()  # finished, or held inside a user callable
        self.release = threading.Event()

    def entered(self, name: str) -> None:
        """A user callable starts in this job; a held job waits here until released."""
        self.callables.append(name)
        if self.hold and len(self.callables) == 1:
            self.settled.set()
            self.release.wait(BOUND_S)


_local = threading.local()


def current_job() -> Job | None:
    """The job this worker thread runs, if it is a :class:`StepExecutor`'s."""
    job: Job | None = getattr(_local, "job", None)
    return job


class StepExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor, so that worker threads reach known points.

    A job submitted by a counted step has run to its end before the step awaits it,
    except, when ``hold`` is set, the job of the step that ends at the injection
    point: that one stops at the entry of its first user callable until
    :meth:`release_held` (the operation under test has ended by then).
    """

    def __init__(self, injector: Injector, hold: bool) -> None:
        super().__init__(max_workers=8, thread_name_prefix="orbit-test-step")
        self.injector = injector
        self.hold = hold
        self._held: list[tuple[Job, concurrent.futures.Future[Any]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        job = Job(self.hold and self.injector.next_point_is_the_one())

        def run() -> Any:
            _local.job = job
            try:
                return fn(*args, **kwargs)
            finally:
                _local.job = None
                job.settled.set()

        future = super().submit(run)
        if not job.settled.wait(BOUND_S):
            raise AssertionError("a worker-thread job neither finished nor reached a callable")
        if not future.done():
            self._held.append((job, future))
        self.injector.submitted(job)
        return future

    def release_held(self) -> None:
        """Let the held jobs go on, and wait until they have finished."""
        held, self._held = self._held, []
        for job, _ in held:
            job.release.set()
        concurrent.futures.wait([future for _, future in held], BOUND_S)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.release_held()
        super().shutdown(wait, cancel_futures=cancel_futures)
