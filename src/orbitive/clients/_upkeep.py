"""The client pool's upkeep thread: death watch, no stranding, timeouts, warm floor.

One daemon thread per ClientPool per process. Each round:

1. reports members that died (``Pool.reap_dead``), so their clients and
   creation claims return without a supervisor (at most every interval);
2. retires the key's idle clients of this process while another process
   waits at ``max_live`` (``retire_idle(FOR_WAITER)``): the waiter can then
   create. A client whose turn is over (``handoff_after``, ``handoff_uses``)
   goes at once, any other after :data:`HANDOFF_GRACE_S` of idleness;
3. retires clients idle longer than ``idle_timeout`` (above the ``min_idle``
   floor) or older than ``max_lifetime``;
4. refills the ``min_idle`` floor, claiming only this process's share of the
   fleet-wide deficit (``claim_warm``);
5. with a budget, keeps this process within the host's share of it
   (:meth:`~._allowance.Allowance.tend`): retires idle clients above the cap,
   severs clients in use when the host's units may lapse, and becomes the
   host's steward when there is none;
6. for a pool that lends its idle clients, ages out the reservations of them no
   borrower delivered within :data:`LOAN_DELIVERY_GRACE_S`.

While the process holds idle clients the thread sleeps on the key's version
word, so a waiter elsewhere (which bumps the key when it starts waiting) is
noticed at once; otherwise it sleeps for the interval (with a budget, at most
until its next stop or sever time). Rounds are at least
:data:`MIN_ROUND_S` apart, so a busy key does not keep it spinning.

The thread holds the pool's parts, never the pool: a pool dropped unclosed is
collected, and its finalizer stops the thread (:meth:`Upkeep.stop`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Final, Generic, TypeVar, final

from .._core._errors import OrbitError
from .._core._fleet import Fleet
from ..pool import Key, Pool
from ..pool._availability import FOR_IDLE_TIMEOUT, FOR_LIFETIME, FOR_WAITER
from ._allowance import Allowance
from ._callbacks import run_anywhere
from ._checkout import Checkout
from ._ledger import Entry, Family, Ledger
from ._options import HANDOFF_GRACE_S, PoolOptions
from ._retiring import Retiring
from ._statistics import Counters

_log = logging.getLogger("orbitive.clients")

#: The retirements the upkeep logs: why, and the option that bounds them (seconds).
_LOGGED: Final[dict[int, tuple[str, Callable[[PoolOptions], float]]]] = {
    FOR_IDLE_TIMEOUT: ("idle longer than idle_timeout", lambda options: options.idle_timeout),
    FOR_LIFETIME: ("past max_lifetime", lambda options: options.max_lifetime),
}

C = TypeVar("C")

#: Shortest time between two rounds (a woken thread with nothing to do rests).
MIN_ROUND_S: Final = 0.01
#: Seconds a borrower may take from reserving an idle client of a lending pool to
#: delivering its lease (milliseconds when it runs): one that has not by then died or
#: stalled, and the upkeep ages its reservation out, so the client serves again (a
#: lease delivered later is refused, and its borrower tries another way).
LOAN_DELIVERY_GRACE_S: Final = 2.0


@final
class Upkeep(Generic[C]):
    """The upkeep thread of one ClientPool in this process (see the module).

    Args:
        key, options: the pool's.
        fleet: the pool's fleet; once it is closed (its regions unmapped, perhaps under a
            round) the thread ends without reporting.
        handle: the pool's table handle (death reports, the key's version).
        ledger: the key's clients in this process.
        checkout: registers what the refill creates.
        retiring: the pool's closing.
        counters: the pool's counters.
        create: the pool's ``create`` (an awaitable result runs on a loop of its own).
        interval: seconds between rounds when nothing wakes the thread.
        lending: the pool's family when it lends its idle clients (transaction mode's
            server connections): their reservations no borrower delivered age out.
    """

    def __init__(
        self,
        key: Key,
        options: PoolOptions,
        fleet: Fleet,
        handle: Pool,
        ledger: Ledger[C],
        checkout: Checkout[C],
        retiring: Retiring,
        counters: Counters,
        create: Callable[[], Any],
        interval: float,
        lending: Family[C] | None = None,
    ) -> None:
        self.interval = interval
        self._lending = lending
        self._last_aging = 0.0  # time.monotonic() of the last aging of reservations
        self.failures = 0
        self._key, self._options, self._handle, self._ledger = key, options, handle, ledger
        self._fleet = fleet
        self._checkout, self._retiring, self._counters = checkout, retiring, counters
        self._create = create
        self._stop = threading.Event()
        self._last_reap = 0.0
        self._budget_due = math.inf  # seconds from the last round to the budget's next event
        self._thread = threading.Thread(target=self._run, name="orbit-clients-upkeep", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() and not self._fleet.closed:
            try:
                self._round()
                self._sleep()
            except (OrbitError, OSError):
                self._stop.wait(self.interval)  # a table or fleet that cannot be read now
            except Exception:  # reported; the upkeep must go on
                if not self._fleet.closed:  # else the table was unmapped under the round
                    self._report()
                self._stop.wait(self.interval)

    def _sleep(self) -> None:
        self._stop.wait(MIN_ROUND_S)
        pause = max(MIN_ROUND_S, min(self.interval, self._budget_due))
        if self._ledger.holds_idle() and not self._stop.is_set():
            version = self._handle.version(self._key)
            self._handle.wait_capacity(self._key, version, pause)
        else:
            self._stop.wait(pause)

    def _round(self) -> None:
        now = time.monotonic()
        if now - self._last_reap >= self.interval:
            self._last_reap = now
            self._handle.reap_dead()
        options = self._options
        # At most twice a grace: no reservation younger than it can age out, and a round
        # may come every MIN_ROUND_S while the key is busy (a table step per idle client).
        if self._lending is not None and now - self._last_aging >= LOAN_DELIVERY_GRACE_S / 2:
            self._last_aging = now
            self._ledger.age_reservations(self._lending, LOAN_DELIVERY_GRACE_S)
        if self._ledger.holds_idle():
            turn, uses = options.handoff_after, options.handoff_uses or 1 << 64
            self._retire_idle(
                FOR_WAITER,
                lambda e: not e.in_turn(now, turn, uses) or now - e.idle_since >= HANDOFF_GRACE_S,
            )
            idle_timeout, max_lifetime = options.idle_timeout, options.max_lifetime
            self._retire_idle(FOR_IDLE_TIMEOUT, lambda e: now - e.idle_since >= idle_timeout)
            self._retire_idle(FOR_LIFETIME, lambda e: now - e.created_at >= max_lifetime)
        if options.min_idle:
            self._refill()
        allowance = self._ledger.allowance
        if allowance is not None:
            self._budget_due = self._tend(allowance)

    def _tend(self, allowance: Allowance) -> float:
        """This process's part in the budget (:meth:`~._allowance.Allowance.tend`)."""
        ledger = self._ledger

        def live() -> int:
            counted = ledger.census()
            return counted.live + counted.creating

        def take_idle(reason: int, cap: int) -> list[Entry[C]]:
            return ledger.idle_to_retire(lambda _: True, reason, cap, 0)

        return allowance.tend(
            live, take_idle, self._retiring.retire_all, ledger.in_use, self._sever, ledger.shed
        )

    def _sever(self, entry: Entry[C]) -> None:
        """Sever a client in use (its ``sever``; its errors are counted): once handed back,
        it is retired."""
        entry.severed = True
        if entry.sever is None:
            return
        try:
            entry.sever(entry.client)
        except Exception:
            self._counters.close_errors += 1
        self._counters.severed += 1

    def _retire_idle(self, reason: int, due: Callable[[Entry[C]], bool]) -> None:
        """Retire idle clients, oldest first, while ``due(entry)`` and the table agrees;
        those retired for ``idle_timeout`` or ``max_lifetime`` are logged (INFO on
        ``orbitive.clients``), how many and why."""
        options = self._options
        taken = self._ledger.idle_to_retire(due, reason, options.max_live, options.min_idle)
        if taken and reason in _LOGGED:
            why, bound = _LOGGED[reason]
            _log.info(
                "%s: retiring %d idle client(s) %s (%g s)",
                self._checkout.where,
                len(taken),
                why,
                bound(options),
            )
        self._retiring.retire_all(taken)

    def _refill(self) -> None:
        """Create idle clients while this process may claim part of the warm deficit."""
        options = self._options
        while not self._stop.is_set():
            permit = self._ledger.claim_warm(options.max_live, options.min_idle)
            if permit is None:
                return
            try:
                client = run_anywhere(self._create)
            except BaseException as error:
                permit.finish()
                if not isinstance(error, Exception):
                    raise
                self._checkout.failed_create(error, "to refill min_idle")
                return
            self._checkout.created()
            self._checkout.registered(permit, client, active=False)

    def _report(self) -> None:
        self.failures += 1
        kind, error, trace = sys.exc_info()
        with contextlib.suppress(Exception):
            threading.excepthook(threading.ExceptHookArgs([kind, error, trace, self._thread]))

    def stop(self) -> None:
        """Let the thread end after its round (it does not wait). Idempotent."""
        self._stop.set()

    def close(self) -> None:
        """Stop the thread and wait for it (at most one round). Idempotent."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
