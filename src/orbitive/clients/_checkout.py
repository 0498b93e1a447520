"""The checkout and the return: an I/O-free plan under thin sync and asyncio drivers.

A checkout takes one of this process's idle clients of the key (the ledger's),
or claims creation under ``max_live`` fleet-wide, or counts itself as a waiter
in the pool table (so owners holding idle clients elsewhere retire one for it)
and sleeps on the key's version word, in slices of at most
:data:`WAIT_SLICE_S`, until its deadline. In remote mode a request may also
run on another process's idle client (a borrow), tried after ours and before
a claim.

:meth:`Checkout.plan` holds the decisions and does none of the user's I/O: it
yields what to do (:class:`Use` a client, :class:`Create` one, :class:`Borrow`,
:class:`Wait`) and takes the answer back. :meth:`Checkout.run` and
:meth:`Checkout.run_async` do each action their way, with the sync and asyncio
create and check steps beside each other below; the return (reset, then keep
idle or retire) follows them.

A checkout right after this process closed a client for another process's
waiter is *polite* (:meth:`~._ledger.Ledger.polite`): it waits one change of
the key, at most :data:`~._options.HANDOFF_GRACE_S`, before it claims. A
checkout at ``max_live`` that finds only another family's client idle in its
process retires that client (:meth:`~._ledger.Ledger.take_foreign`) and
creates in its unit.

**Every exit path returns or retires the client exactly once**, a
``BaseException`` included:

* an interrupted sync create returns its claim; an asyncio caller cancelled or
  interrupted while ``create`` runs leaves it running, and its client joins
  the idle ones when it comes (or its claim returns, if it fails);
* a ``BaseException`` (``KeyboardInterrupt``) from a sync ``check`` or
  ``reset`` leaves the client in an unknown state: it is handed over to be
  closed before the exception goes on;
* an asyncio caller cancelled or interrupted while its ``check`` or ``reset``
  runs (``wait_for``, a client that went away) leaves the callable running;
  once it ends, the client is kept idle if it passed (and the table keeps it),
  else closed (:meth:`Checkout.outlasting`): never closed under the callable;
* a waiter is counted out as soon as it is served, or when the plan closes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar, final, overload

from .._core._errors import (
    ClientCreateError,
    FleetError,
    OrbitError,
    PoolClosed,
    PoolTimeout,
    TooManyRequests,
)
from ..pool import CreationPermit, Key, Pool
from ._board import boot_ns
from ._callbacks import call_sync, started
from ._ledger import Entry, Family, Ledger
from ._options import HANDOFF_GRACE_S, PoolOptions, seconds
from ._retiring import Retiring
from ._statistics import Counters

_log = logging.getLogger("orbitive.clients")

C = TypeVar("C")
R = TypeVar("R")

#: Longest single sleep of a waiter: it re-checks at least this often.
WAIT_SLICE_S: Final = 1.0


@final
@dataclass(frozen=True, slots=True)
class Use:
    """Check an idle client taken for checkout (answer: whether it is usable)."""

    entry: Entry[Any]


@final
@dataclass(frozen=True, slots=True)
class Create:
    """Run ``create`` under this claim (answer: the new client)."""

    permit: CreationPermit


@final
@dataclass(frozen=True, slots=True)
class Borrow:
    """Run the request on another process's idle client (answer: the reply, or None;
    in transaction mode: a loan of it, or None)."""


@final
@dataclass(frozen=True, slots=True)
class Wait:
    """Sleep until the key's version differs from ``version``, at most ``seconds``
    (answer: the new version, or None)."""

    version: int
    seconds: float


Action = Use | Create | Borrow | Wait
_BORROW: Final = Borrow()


@final
class Checkout(Generic[C]):
    """The checkout and return of one ClientPool in this process (see the module).

    Args:
        key: the pool's key.
        options: the pool's options.
        handle: the pool's table handle (its waits; closing it ends them).
        ledger: the key's clients in this process.
        family: the pool's family in the ledger.
        retiring: the pool's closing.
        counters: the pool's counters.
        create, close, check, reset, sever: the pool's callables.
    """

    def __init__(
        self,
        key: Key,
        options: PoolOptions,
        handle: Pool,
        ledger: Ledger[C],
        family: Family[C],
        retiring: Retiring,
        counters: Counters,
        create: Callable[[], Any],
        close: Callable[[C], Any],
        check: Callable[[C], Any] | None,
        reset: Callable[[C], Any] | None,
        sever: Callable[[C], Any] | None = None,
        *,
        name: str,
    ) -> None:
        self.key, self.options, self.name = key, options, name
        self._sever = sever
        #: How the log records name the pool: its fleet, and its label or key.
        self.where = f"{ledger.where} ({name})"
        self._handle, self._ledger, self._family, self._retiring = handle, ledger, family, retiring
        self._counters = counters
        self._create, self._close, self._check, self._reset = create, close, check, reset
        # The options the return reads, as plain attributes.
        self._max_live, self._idle_limit = options.max_live, options.idle_limit
        self._max_lifetime, self._turn = options.max_lifetime, options.handoff_after
        self._turn_uses = options.handoff_uses or 1 << 64  # None: no bound by count
        self.closed = False
        #: Failed creates since the last that succeeded, and when the first of them failed.
        self._create_failures = 0
        self._failing_since = 0.0

    def _check_open(self) -> None:
        """Raise PoolClosed once the pool is closed."""
        if self.closed:
            raise PoolClosed(f"client pool of {self.name} is closed", key=self.key)

    # -- the plan -----------------------------------------------------------------------

    def plan(self, timeout: float | None, borrowing: bool) -> Generator[Action, Any, Any]:
        """The checkout's decisions, without the I/O: yields what to do, returns the entry
        checked out (or, ``borrowing``, what the borrow gave: the reply another process's
        client gave in remote mode, a loan in transaction mode).

        A waiter is counted out as soon as it is served (before its client is
        checked or created), or when the generator closes.
        """
        end, is_polite = self._deadline(timeout), self._ledger.polite()
        version: int | None = None
        began = 0.0  # when this caller began to wait at max_live
        try:
            while True:
                self._check_open()
                step: Entry[C] | CreationPermit | None = self._take()
                if step is None and borrowing:
                    reply = yield _BORROW
                    if reply is not None:
                        return reply
                if step is None and not is_polite:
                    step = self._ledger.claim(self._max_live)
                    if step is None:
                        self._retire_foreign()
                if step is not None and version is not None:  # served: no longer a waiter
                    version = None
                    self._stop_waiting(began, timed_out=False)
                if isinstance(step, Entry):
                    if (yield Use(step)):
                        return step
                elif step is not None:
                    return self.registered(step, (yield Create(step)))
                elif version is None:
                    version, began = self._start_waiting(), time.monotonic()
                else:
                    try:
                        seconds_left = self._wait_slice(end, is_polite)
                    except PoolTimeout:
                        version = None
                        self._stop_waiting(began, timed_out=True)
                        raise
                    changed = yield Wait(version, seconds_left)
                    version = self._handle.version(self.key) if changed is None else changed
                    is_polite = False
        finally:
            if version is not None:
                self._stop_waiting(began, timed_out=None)

    @overload
    def run(self, timeout: float | None, borrow: None = None) -> Entry[C]: ...

    @overload
    def run(self, timeout: float | None, borrow: Callable[[], R | None]) -> Entry[C] | R: ...

    def run(self, timeout: float | None, borrow: Callable[[], Any] | None = None) -> Entry[C] | Any:
        """The sync driver of :meth:`plan` (raises as ``ClientPool.getconn`` documents)."""
        steps = self.plan(timeout, borrow is not None)
        try:
            action = next(steps)
            while True:
                if isinstance(action, Use):
                    action = steps.send(self.usable(action.entry))
                elif isinstance(action, Create):
                    action = steps.send(self.made(action.permit))
                elif isinstance(action, Wait):
                    changed = self._handle.wait_capacity(self.key, action.version, action.seconds)
                    action = steps.send(changed)
                else:
                    action = steps.send(None if borrow is None else borrow())
        except StopIteration as done:
            return done.value
        except FleetError:
            self._check_open()  # closed meanwhile: PoolClosed
            raise
        finally:
            steps.close()

    @overload
    async def run_async(self, timeout: float | None, borrow: None = None) -> Entry[C]: ...

    @overload
    async def run_async(
        self, timeout: float | None, borrow: Callable[[], Awaitable[bytes | None]]
    ) -> Entry[C] | bytes: ...

    async def run_async(
        self, timeout: float | None, borrow: Callable[[], Awaitable[bytes | None]] | None = None
    ) -> Entry[C] | bytes:
        """Asyncio twin of :meth:`run`: waits on the pool's readiness descriptor."""
        steps = self.plan(timeout, borrow is not None)
        try:
            action = next(steps)
            while True:
                if isinstance(action, Use):
                    action = steps.send(await self.usable_async(action.entry))
                elif isinstance(action, Create):
                    action = steps.send(await self.made_async(action.permit))
                elif isinstance(action, Wait):
                    changed = await self._handle.poll_capacity(
                        self.key, action.version, action.seconds
                    )
                    action = steps.send(changed)
                else:
                    action = steps.send(None if borrow is None else await borrow())
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        except FleetError:
            self._check_open()  # closed meanwhile: PoolClosed
            raise
        finally:
            steps.close()

    # -- the plan's table steps ---------------------------------------------------------

    def _take(self) -> Entry[C] | None:
        """One of this process's idle clients of the key, now checked out (newest first),
        or None; those whose resource was closed, reset or drained are retired. None
        while the key's budget units may lapse (a process woken from a pause past its
        last look reads the host's record first: its upkeep retires or severs them)."""
        allowance = self._ledger.allowance
        if allowance is not None and boot_ns() >= allowance.stop_ns and allowance.lapsing():
            return None
        entry = self._ledger.take(self._family)
        if entry is not None or not self._family.idle:
            return entry
        entry, doomed = self._ledger.take_sorting(self._family)
        for each in doomed:
            self._retiring.hand_over(each)
        return entry

    def _retire_foreign(self) -> None:
        """At ``max_live`` with another family's client idle here: retire it, so that
        this waiter creates in its unit instead of waiting for ever (see the ledger)."""
        foreign = self._ledger.take_foreign(self._family)
        if foreign is not None:
            self._retiring.hand_over(foreign)

    def _start_waiting(self) -> int:
        """Count this caller in as a waiter; the key's version.

        Raises:
            TooManyRequests: ``max_waiting`` callers of this process already wait.
        """
        version = self._ledger.start_waiting(self.options.max_waiting)
        if version is None:
            self._counters.refused += 1
            raise TooManyRequests(
                f"{self._ledger.waiters} callers of this process already wait for "
                f"{self.name} (max_waiting {self.options.max_waiting})",
                key=self.key,
            )
        self._counters.queued += 1
        return version

    def _stop_waiting(self, began: float, *, timed_out: bool | None) -> None:
        """Count this waiter out, and its wait since ``began`` (``time.monotonic()``): in
        this pool's ``waited_s``, and in the key's wait counters when it ended in a client
        (``timed_out`` False) or a timeout (True), not otherwise (None)."""
        waited = time.monotonic() - began
        self._counters.waited_s += waited
        outcome = None if timed_out is None else (int(waited * 1e6), timed_out)
        self._ledger.stop_waiting(outcome)

    def _deadline(self, timeout: float | None) -> float:
        """``time.monotonic()`` seconds a checkout gives up at (None: ``acquire_timeout``).

        Raises:
            InvalidPoolOptions: a bad timeout.
        """
        wait = self.options.acquire_timeout if timeout is None else seconds("timeout", timeout)
        return time.monotonic() + wait

    def _wait_slice(self, end: float, is_polite: bool) -> float:
        """Seconds the next wait may last: at most :data:`WAIT_SLICE_S`, and at most
        :data:`HANDOFF_GRACE_S` for a polite checkout.

        Raises:
            PoolTimeout: ``end`` has passed.
        """
        remaining = end - time.monotonic()
        if remaining <= 0:
            self._counters.timeouts += 1
            cap = self._ledger.cap
            bound = (
                f"max_live {self._max_live} reached fleet-wide"
                if cap >= self._max_live
                else f"the budget lets this host hold {cap} now, max_live {self._max_live}"
            )
            raise PoolTimeout(
                f"no client for {self.name} within the timeout ({bound})", key=self.key
            )
        return min(remaining, HANDOFF_GRACE_S if is_polite else WAIT_SLICE_S)

    # -- create -------------------------------------------------------------------------

    def made(self, permit: CreationPermit) -> C:
        """Run ``create`` under ``permit``.

        Raises:
            ClientCreateError: ``create`` raised (the claim is returned).
            InvalidPoolOptions: ``create`` returned an awaitable.
        """
        try:
            client: C = call_sync("create", self._create)
        except BaseException as error:
            failure = self._failed_create(permit, error)
            if failure is error:
                raise
            raise failure from error
        if self._create_failures:
            self.created()
        return client

    async def made_async(self, permit: CreationPermit) -> C:
        """Asyncio twin of :meth:`made`. A caller cancelled or interrupted meanwhile
        leaves the create running, and its client joins the idle ones (:meth:`_adopt`)."""
        creating = started(self._create)
        try:
            client: C = await asyncio.shield(creating)
        except BaseException as error:
            if not _raised_by(creating, error):  # the caller's interruption: it runs on
                _when_done(creating, lambda done: self._adopt(permit, done))
                raise
            failure = self._failed_create(permit, error)
            if failure is error:
                raise
            raise failure from error
        if self._create_failures:
            self.created()
        return client

    def _failed_create(self, permit: CreationPermit, error: BaseException) -> BaseException:
        """Return the claim; the error to raise (ours and a BaseException as they are, the
        user's wrapped, and logged at WARNING on ``orbitive.clients``)."""
        permit.finish()
        if isinstance(error, OrbitError) or not isinstance(error, Exception):
            return error
        self.failed_create(error, "for a checkout")
        return ClientCreateError(f"create() failed for {self.name}: {error!r:.200}", key=self.key)

    def failed_create(self, error: Exception, purpose: str) -> None:
        """Count a ``create()`` that raised ``error`` (its claim is returned); the first of
        a run of failures is logged at WARNING on ``orbitive.clients``, with its cause."""
        self._counters.create_errors += 1
        self._create_failures += 1
        if self._create_failures == 1:
            self._failing_since = time.monotonic()
            _log.warning(
                "%s: create() %s failed: %.200r; its claim on max_live is returned (later "
                "failures are counted, not logged, until a create succeeds)",
                self.where,
                purpose,
                error,
            )

    def created(self) -> None:
        """After a ``create()`` that succeeded: if creates were failing, log (INFO) that
        they work again, and after how many failures."""
        failures, self._create_failures = self._create_failures, 0
        if failures:
            _log.info(
                "%s: create() works again, after %d failure(s) over %.1f s",
                self.where,
                failures,
                time.monotonic() - self._failing_since,
            )

    def registered(self, permit: CreationPermit, client: C, *, active: bool = True) -> Entry[C]:
        """Register a created client, checked out (``active``) or idle; the permit ends
        after. A client the table refuses is closed.

        Raises:
            PoolClosed, and the table's errors: as :meth:`~._ledger.Ledger.register`.
        """
        try:
            entry = self._ledger.register(
                permit, client, self._family, self._close, active=active, sever=self._sever
            )
        except BaseException:
            self._retiring.close_quietly(client, self._close)
            raise
        self._counters.created += 1
        return entry

    def _adopt(self, permit: CreationPermit, done: asyncio.Future[Any]) -> None:
        """A create whose caller gave up ended: keep its client idle, or close it."""
        if done.cancelled() or done.exception() is not None:
            permit.finish()
        elif self.closed:
            permit.finish()
            self._retiring.close_later(done.result(), self._close)
        else:
            entry = self.registered(permit, done.result())
            self.give_back(self._ledger.recall(entry))

    # -- check --------------------------------------------------------------------------

    def usable(self, entry: Entry[C]) -> bool:
        """Whether an idle client taken for checkout may be used; else it was retired.

        Raises:
            A BaseException from ``check``, once the client is handed over to be closed.
        """
        if time.monotonic() - entry.created_at >= self._max_lifetime:
            self._retiring.retire(self._ledger.recall(self.aged(entry)))
            return False
        if self._check is None:
            return True
        try:
            healthy = call_sync("check", self._check, entry.client) is not False
        except Exception:
            healthy = False
        except BaseException:  # interrupted: the client's state is unknown
            self._retiring.hand_over(self._ledger.recall(entry))
            raise
        if not healthy:
            self._counters.check_failures += 1
            self._retiring.retire(self._ledger.recall(entry))
        return healthy

    async def usable_async(self, entry: Entry[C]) -> bool:
        """Asyncio twin of :meth:`usable`; a caller cancelled or interrupted during the
        check leaves it running (:meth:`outlasting`)."""
        if time.monotonic() - entry.created_at >= self._max_lifetime:
            await self._retiring.retire_async(self._ledger.recall(self.aged(entry)))
            return False
        if self._check is None:
            return True
        try:
            outcome = await self.outlasting(entry, started(self._check, entry.client), _passed)
            healthy = outcome is not False
        except Exception:
            healthy = False
        if not healthy:
            self._counters.check_failures += 1
            await self._retiring.retire_async(self._ledger.recall(entry))
        return healthy

    async def outlasting(
        self, entry: Entry[C], running: asyncio.Future[Any], passed: Callable[[Any], bool]
    ) -> Any:
        """Await ``running``, a user callable on ``entry``'s checked-out client, as
        :func:`~._callbacks.started` started it.

        A caller cancelled or interrupted meanwhile leaves it running (a
        coroutine in a task of its own, a sync callable in its worker thread,
        which cannot be stopped), so the client is never closed under it. Once
        it ends, the client is kept idle if ``passed(result)`` (and the table
        keeps it), else retired: exactly once either way.

        Raises:
            Exception: the callable's own; ``entry`` stays the caller's.
            BaseException: the callable's own (KeyboardInterrupt, say: the
                client is handed over to be closed), or the caller's
                cancellation or interruption; ``entry`` is no longer the caller's.
        """
        try:
            return await asyncio.shield(running)
        except BaseException as error:
            if not _raised_by(running, error):  # the caller's interruption: it runs on
                self._ledger.recall(entry)
                _when_done(running, lambda done: self._settle(entry, done, passed))
            elif not isinstance(error, Exception):  # its own interrupt: state unknown
                self._retiring.hand_over(self._ledger.recall(entry))
            raise

    def _settle(
        self, entry: Entry[C], done: asyncio.Future[Any], passed: Callable[[Any], bool]
    ) -> None:
        """Where a client goes once the callable its caller gave up on has ended."""
        failed = done.cancelled() or done.exception() is not None or not passed(done.result())
        if failed or self.closed:
            self._retiring.hand_over(entry)
        else:
            self.give_back(entry)

    # -- the return ---------------------------------------------------------------------

    def put(self, entry: Entry[C]) -> None:
        """Take back a client handed back (out of the ledger): reset it, then keep it idle
        or retire it.

        Raises:
            A BaseException from ``reset``, once the client is handed over to be closed.
        """
        if self.closed:
            self._retiring.retire(entry)
            return
        if self._reset is not None:
            try:
                call_sync("reset", self._reset, entry.client)
            except Exception:
                self._counters.reset_failures += 1
                self._retiring.retire(entry)
                return
            except BaseException:  # interrupted: the client's state is unknown
                self._retiring.hand_over(entry)
                raise
        self.give_back(entry)

    async def put_async(self, entry: Entry[C]) -> None:
        """Asyncio twin of :meth:`put`; a caller cancelled or interrupted during the reset
        leaves it running (:meth:`outlasting`)."""
        if self.closed:  # closed on this loop, as the rest of close_async's
            await self._retiring.retire_async(entry)
            return
        if self._reset is not None:
            try:
                await self.outlasting(entry, started(self._reset, entry.client), _ran)
            except Exception:
                self._counters.reset_failures += 1
                await self._retiring.retire_async(entry)
                return
        self.give_back(entry)

    def give_back(self, entry: Entry[C]) -> None:
        """Keep a returned client idle, or hand it over to be closed (one table step)."""
        now = time.monotonic()
        in_turn = entry.in_turn(now, self._turn, self._turn_uses)
        if now - entry.created_at >= self._max_lifetime:
            self._retiring.hand_over(self.aged(entry))
        elif not self._ledger.give_back(entry, now, in_turn, self._idle_limit, self._max_live):
            self._retiring.hand_over(entry)

    def aged(self, entry: Entry[C]) -> Entry[C]:
        """Log that ``entry``'s client is past ``max_lifetime`` and is retired (INFO on
        ``orbitive.clients``); returns it."""
        _log.info(
            "%s: retiring a client %.1f s old, past max_lifetime (%g s)",
            self.where,
            time.monotonic() - entry.created_at,
            self._max_lifetime,
        )
        return entry


def _raised_by(running: asyncio.Future[Any], error: BaseException) -> bool:
    """Whether ``error`` is what ``running`` itself raised; else it interrupted the caller
    while ``running`` went on (or ``running`` ended cancelled)."""
    return running.done() and not running.cancelled() and running.exception() is error


def _when_done(running: asyncio.Future[Any], then: Callable[[asyncio.Future[Any]], None]) -> None:
    """``then(running)`` now if it is done, else once it is."""
    if running.done():
        then(running)
    else:
        running.add_done_callback(then)


def _passed(outcome: Any) -> bool:
    """A check passed unless it returned False."""
    return outcome is not False


def _ran(outcome: Any) -> bool:
    """A reset or a handler passed when it returned at all."""
    del outcome
    return True
