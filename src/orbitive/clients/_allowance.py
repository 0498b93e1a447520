"""Allowance: what this process may create under its host's share of a budget, and
what it must give up.

One per process life and budget, held by the budget key's ledger (every pool of
the budget in the process shares it). The host's record (:mod:`._board`) says
how many live clients the host may hold, the *cap*, and until when its units
are surely held, the *deadline*. This process keeps to them in three places:

* **Creation** claims under the cap in force, inside the board's section
  (:meth:`Allowance.capped`): the cap, or 0 from ``ttl / 4`` before the
  deadline on. A checkout that finds no unit free waits as a waiter of the key,
  which the steward reads as demand.
* **Returns** keep a client idle only while the key is within the cap and the
  deadline is ``ttl / 4`` away (the ledger's ``shed_at``); otherwise the client
  is retired when handed back.
* **Upkeep** (:meth:`Allowance.tend`, every round of each pool's upkeep thread,
  and at the next stop or sever time): while the key holds more than the cap,
  this process retires its idle clients above it; from ``ttl / 8`` before the
  deadline on, or at once when the record says units were lost, it severs its
  clients in use above it (the pool's ``sever`` callable: the client's socket is
  shut down, the user's call fails, and the client is retired when handed back).
  It also makes this process the steward when there is none, the steward's
  life is over, or its stewardship lease has run out (a steward paused or stuck:
  :class:`~._steward.Steward`); the round after that lease ends is due then.
* **The wake check** (:meth:`Allowance.lapsing`, before a checkout hands out an
  idle client): a process that finds its last look's stop time passed (it was
  paused, or its upkeep was) reads the record again; while the units may lapse
  it hands out no idle client and creates none, and its upkeep, woken by the
  same pause, retires the idle ones and severs those in use.

Before the first pool of the budget in a process starts, :func:`check_coordinator`
asks the coordinator once: is it reachable, does it keep what it grants, and do
the other hosts give the budget the same total (each a named error).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar, final

from .._core._errors import OrbitError
from .._core._fleet import Fleet
from ..pool import Key
from ..pool._availability import FOR_CAP
from ._board import Board, Record, boot_ns
from ._budget import Budget
from ._coordinator import Coordinator
from ._options import PoolOptions
from ._steward import Steward

T = TypeVar("T")

#: The bound on the calls of the check at start-up, in seconds (the first creates the
#: store's tables), unless the budget's URL sets one.
CHECK_TIMEOUT_S: Final = 5.0
#: Budgets this process life has checked with their coordinator (once each).
_checked: Final[set[Budget]] = set()
_checked_lock = threading.Lock()


def check_coordinator(budget: Budget) -> None:
    """Ask ``budget``'s coordinator, once per process life, whether it can hold the budget.

    Raises:
        BudgetUnavailable: it cannot be reached.
        UnsafeCoordinator: it may forget what it grants.
        BudgetMismatch: other hosts hold the budget under another total.
        InvalidBudget: the store refuses the URL.
    """
    with _checked_lock:
        if budget in _checked:
            return
    coordinator = Coordinator(budget, CHECK_TIMEOUT_S)
    try:
        coordinator.check()
    finally:
        coordinator.close()
    with _checked_lock:
        _checked.add(budget)


@final
class Allowance:
    """This process's part in its host's share of ``budget`` (see the module).

    Args:
        fleet: this process's fleet.
        budget: the budget.
        options: the opening pool's options (sizes the host's demand).
        kind: the pool table's kind.

    Raises:
        InvalidBudget: ``options.min_idle`` is above the total.
        BudgetMismatch: this host holds the budget under another total.
        BudgetUnavailable, UnsafeCoordinator: as :func:`check_coordinator`.
    """

    def __init__(self, fleet: Fleet, budget: Budget, options: PoolOptions, kind: int) -> None:
        budget.check_fits(options)
        check_coordinator(budget)
        self.budget = budget
        self._fleet, self._kind = fleet, kind
        self._board = Board(fleet, budget, options.max_live, options.min_idle)
        self._stop_lead_ns = int(budget.stop_lead * 1e9)
        self._sever_lead_ns = int(budget.sever_lead * 1e9)
        self._lock = threading.Lock()
        self._steward: Steward | None = None
        self.severed = 0  # clients this process severed
        #: CLOCK_BOOTTIME ns from which the host's units may lapse soon, as of the last
        #: look at the record (in the past while it holds none).
        self.stop_ns = 0
        self.elect(self._board.read())

    @property
    def key(self) -> Key:
        """The budget's pool key."""
        return self.budget.key

    @property
    def board(self) -> Board:
        """The host's record of the budget."""
        return self._board

    @property
    def steward(self) -> bool:
        """Whether this process is the host's steward (its thread runs: not deposed)."""
        return self._steward is not None and self._steward.running

    def capped(self, claim: Callable[[int], T]) -> T:
        """``claim(cap)`` inside the board's section, with the cap in force now."""
        return self._board.capped(claim)

    def elect(self, record: Record) -> None:
        """Become the steward, and start its thread, if the host has none, its life is over
        or its lease has run out."""
        me = (self._fleet.node, self._fleet.incarnation)
        if record.steward == me and self._steward is not None and self._steward.running:
            return
        with self._lock:
            if self._steward is not None and not self._steward.running:  # deposed
                self._steward.close()
                self._steward = None
            lease_ns = int((self.budget.call_timeout + self.budget.steward_grace) * 1e9)
            if self._steward is not None or not self._board.elect(me, self._over, lease_ns):
                return
            self._steward = Steward(
                self._fleet, self.budget, self._board, self.budget.key, self._kind, me
            )

    def _over(self, node: int, incarnation: int) -> bool:
        try:
            return self._fleet.incarnation_of(node) != incarnation
        except OrbitError:  # a node outside this fleet (damage): over
            return True

    def tend(
        self,
        live: Callable[[], int],
        take_idle: Callable[[int, int], list[Any]],
        retire: Callable[[list[Any]], None],
        in_use: Callable[[], list[Any]],
        sever: Callable[[Any], None],
        shed: Callable[[int, float], None],
    ) -> float:
        """One round of this process's part (see the module); seconds until the next stop
        or sever time (``inf`` when none is ahead).

        Each decision reads the cap and the key's count in one board section, so a
        claim or a change of the cap never comes between them.

        Args:
            live: the key's live and creating clients on the host.
            take_idle: ``take_idle(reason, cap)`` takes out this process's idle
                clients while the key holds more than ``cap`` (in the board's
                section), and returns them.
            retire: retires what ``take_idle`` took out (after the section).
            in_use: this process's clients in use, not yet severed.
            sever: severs one of them.
            shed: ``shed(cap, at)``: the cap returns see, and the ``time.monotonic()``
                from which they retire.
        """
        record = self._board.read()
        self.elect(record)
        now = boot_ns()
        stop_at = self.stop_ns = record.deadline_ns - self._stop_lead_ns
        sever_at = record.deadline_ns - self._sever_lead_ns

        def look(cap: int) -> tuple[int, int]:
            return cap, live()

        cap, used = self._board.capped(look)
        monotonic = time.monotonic()
        if used > cap:
            shed(cap, monotonic)
        elif record.deadline_ns:
            shed(cap, monotonic + (stop_at - now) / 1e9)
        else:  # no units, so no client: the first ones come with a deadline the next round reads
            shed(cap, math.inf)
        if used > cap:
            retire(self._board.capped(lambda cap: take_idle(FOR_CAP, cap)))
            if record.lost or now >= sever_at:
                excess = self._board.capped(lambda cap: live() - cap)
                for entry in in_use()[: max(0, excess)]:
                    sever(entry)
                    self.severed += 1
        ahead = [at for at in (stop_at, sever_at) if at > now]
        if record.steward is not None and record.steward_until_ns > now:
            ahead.append(record.steward_until_ns)  # the steward's place may be taken then
        return (min(ahead) - now) / 1e9 if ahead else float("inf")

    def lapsing(self) -> bool:
        """Whether the host's units may lapse soon: from ``ttl / 4`` before its deadline on,
        by the record read now (:attr:`stop_ns` is as of the upkeep's last look, and a
        process paused past it reads the record again before it serves)."""
        record = self._board.read()
        self.stop_ns = record.deadline_ns - self._stop_lead_ns  # no units: lapsed
        return boot_ns() >= self.stop_ns

    def numbers(self) -> tuple[int, int, int, int]:
        """The budget's total, the units the host holds, the cap in force, and the ms the
        units are surely held for (0: none held)."""
        record = self._board.read()
        now = boot_ns()
        lapse_ms = max(0, (record.deadline_ns - now) // 1_000_000) if record.units else 0
        return record.total, len(record.units), record.usable(now, self.budget.stop_lead), lapse_ms

    def close(self, wait: bool) -> None:
        """This process's last pool of the budget left: stop its steward, if it is one (it
        gives back what the host no longer uses and resigns; another process of the host
        takes over the rest). ``wait``: until it has."""
        with self._lock:
            steward, self._steward = self._steward, None
        if steward is None:
            return
        if wait:
            steward.close()
        else:
            threading.Thread(target=steward.close, name="orbit-budget-resign", daemon=True).start()

    def __repr__(self) -> str:
        return f"<Allowance budget={self.budget.name!r} steward={self.steward}>"
