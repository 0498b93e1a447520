"""Steward: the one process of a host that holds the host's units of a budget.

Every process of the host that opens a pool naming the budget may become the
steward (:meth:`~._board.Board.elect`): the first to find none, or to find the
steward's life over. Its thread talks to the coordinator; every other process
only reads the host's record. Each round, from one look at the record and one
census of the budget's key on the host:

1. **Renew** every unit in one statement, every ``ttl / 4``. A renewal that
   succeeds moves the deadline to its send time plus the ttl (less a margin);
   one that fails moves nothing, so the host stops creating and retires
   ``ttl / 4`` before the deadline, however long the call hangs. Units a
   renewal finds gone lower the cap at once and mark the record *lost*: the
   host severs the clients beyond the cap without waiting for the deadline.
2. **Grow**: the host's demand is its clients in use and being created plus
   its callers waiting (at least ``min_idle``, at most ``max_live``). Units held
   beyond the cap raise it; beyond them, one unit per statement while the
   coordinator grants them. Each rise bumps the key, so waiters claim at once.
3. **Give**: while the host holds idle clients or spare units, or needs more,
   the steward reads the other hosts' posts every ``handover_within / 4``. If
   another host needs units, a host that needs none keeps only its demand (idle
   clients beyond it are retired by their owners, since the key is over its
   cap) and gives back the units above its clients; a host that needs units too
   gives one back while it holds two more than the poorest host that needs
   them. Demand decides the shares: an idle host keeps nothing beyond its
   floor, and saturated hosts converge to equal shares.
4. **Post** the host's numbers (units held, in use, idle, waiting, need) when
   the ones the other hosts decide by change (units held, and whether it needs
   any), at most every ``handover_within / 4``, and at least every ``ttl / 4``
   (a post lives ``ttl``). Clients in use, idle and waiting move with every
   request; posting each move cost a busy host two statements a round for
   nothing another host reads (``orbit budget`` shows them as of the last post).

The thread sleeps on the key's version word (a new waiter, a client created or
retired wakes it) until its next renewal, post or look is due. A coordinator
that cannot be reached ends the round; the next one starts after a pause of
``handover_within / 4``.

Before each coordinator call and each sleep the steward extends its
*stewardship lease* in the record (:meth:`~._board.Board.beat`) to when it will
act next (the call's bound, or the sleep's end) plus ``ttl / 16``. A steward
that overruns it (paused by SIGSTOP, a debugger, a stalled VM, a C call holding
its GIL) is replaced by the next process of the host whose upkeep looks, which
renews the host's units in time; the old one finds itself deposed at its next
write or beat and ends, and whatever it did meanwhile is safe (a renewal of
units the host still holds, a unit or post taken that nobody records, which
lapses within ``ttl``).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Final, final

from .._core._errors import OrbitError, StoreError
from .._core._fleet import Fleet
from ..pool import Key, Pool
from ..pool._availability import Census, bump, key_census
from ._board import UNITS_MAX, Board, Record, boot_ns, deadline_after
from ._budget import Budget
from ._coordinator import Coordinator, Post, Posted

#: Shortest time between two rounds, in seconds.
MIN_ROUND_S: Final = 0.01


@final
class Steward:
    """The steward's thread for one budget in this process (see the module).

    Args:
        fleet: this process's fleet.
        budget: the budget.
        board: the host's record of it.
        key: the budget's pool key.
        kind: the pool table's kind.
        me: this process's (node, incarnation), as elected.
    """

    def __init__(
        self, fleet: Fleet, budget: Budget, board: Board, key: Key, kind: int, me: tuple[int, int]
    ) -> None:
        self.budget, self.me = budget, me
        self.failures = 0  # rounds a coordinator call failed in
        self._board, self._key = board, key
        self._pool = Pool(fleet, kind=kind)  # its own: the thread outlives no pool's handle
        self._coordinator: Coordinator | None = None
        self._posted: Posted | None = None
        self._post_sent: tuple[int, bool] | None = None  # units held and need > 0, posted
        self._renewed_at = 0  # boot ns the last renewal that succeeded was sent
        self._posted_at = self._looked_at = self._tried_at = 0
        self._needing: list[Post] = []  # the other hosts that needed units at the last look
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orbit-budget-steward", daemon=True)
        self._thread.start()

    # -- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    pause = self._round()
                except _Deposed:
                    return
                except (StoreError, OrbitError, OSError):
                    self.failures += 1
                    pause = self.budget.look_every
                except Exception:  # reported; the steward must go on
                    self.failures += 1
                    self._report()
                    pause = self.budget.look_every
                if not self._sleep(pause):
                    return
        finally:
            self._stop.set()

    def _sleep(self, pause: float) -> bool:
        """Extend the stewardship lease over ``pause`` seconds and sleep them (or until the
        key changes); False if this process is no longer the steward."""
        with contextlib.suppress(OrbitError):  # a fleet being closed: the stop is set
            if not self._board.beat(self.me, _ns(pause + self.budget.steward_grace)):
                return False
        self._stop.wait(MIN_ROUND_S)
        if not self._stop.is_set() and pause > MIN_ROUND_S:
            with contextlib.suppress(OrbitError):
                version = self._pool.version(self._key)
                self._pool.wait_capacity(self._key, version, pause - MIN_ROUND_S)
        return True

    def _report(self) -> None:
        kind, error, trace = sys.exc_info()
        with contextlib.suppress(Exception):
            threading.excepthook(threading.ExceptHookArgs([kind, error, trace, self._thread]))

    # -- one round ------------------------------------------------------------------------

    def _round(self) -> float:
        """One round (see the module); the seconds until the next is due."""
        coordinator = self._coordinator
        if coordinator is None:
            coordinator = self._coordinator = Coordinator(self.budget)
        record = self._board.read()
        if record.steward != self.me:
            raise _Deposed
        units = [grant for packed in record.units if (grant := coordinator.unpack(packed))]
        if self._posted is None and record.post is not None:  # taken over: the old post
            self._posted = _posted(coordinator, record.post)
        census = key_census(self._pool._t(), self._key)
        now = boot_ns()
        if units and now - self._renewed_at >= _ns(self.budget.renew_every):
            self._due()
            units, record = self._renew(coordinator, record, units)
        if record.lost and census.live + census.creating <= record.cap:
            self._write(lost=False)
        if len(units) > record.cap:  # a give under way: its clients may be gone by now
            units = self._release_above(coordinator, record, units, record.cap)
        demand = _demand(census, record)
        if self._looking(census, record, units, demand, now):
            self._look(coordinator, record, now)
        if self._needing:
            units = self._give(coordinator, record, units, census, demand)
        if len(units) <= self._board.read().cap or not self._needing:
            units, record = self._grow(coordinator, units, demand, now)
        need = max(0, demand - len(units))
        self._post(coordinator, record, units, census, need, now)
        return self._next_due(census, record, units, demand)

    def _renew(
        self, coordinator: Coordinator, record: Record, units: list[Any]
    ) -> tuple[list[Any], Record]:
        """Renew every unit in one statement; the units still held and the record after."""
        sent = boot_ns()
        renewed = coordinator.renew(record.host, units)
        kept = [grant for grant in renewed if grant is not None]
        lost = len(kept) < len(units)
        self._write(
            units=[coordinator.pack(grant) for grant in kept],
            deadline_ns=deadline_after(sent, self.budget.ttl) if kept else 0,
            cap=min(record.cap, len(kept)),
            lost=lost or record.lost,
        )
        self._renewed_at = sent
        if lost:
            self._bump()  # the owners sever what the cap no longer covers
        return kept, self._board.read()

    def _look(self, coordinator: Coordinator, record: Record, now: int) -> None:
        """Read the posts: the other hosts that need units, and whether any unit is free."""
        self._looked_at = now
        self._due()
        posts = coordinator.posts()
        self._needing = [post for post in posts if post.host != record.host and post.need > 0]
        if sum(post.held for post in posts) < self.budget.total:
            self._tried_at = 0  # a unit looks free: try for it now

    def _looking(
        self, census: Census, record: Record, units: list[Any], demand: int, now: int
    ) -> bool:
        """Whether to read the other hosts' posts now: every ``handover_within / 4`` while
        the host could give at once (idle clients above its floor, units above its
        clients) or needs units, else every ``ttl / 4`` (a host whose clients are all
        busy may hold more than its share)."""
        age = now - self._looked_at
        if age >= _ns(self.budget.renew_every):
            self._needing = []  # what an old look said no longer counts
            return True
        return age >= _ns(self.budget.look_every) and self._eager(census, record, units, demand)

    @staticmethod
    def _eager(census: Census, record: Record, units: list[Any], demand: int) -> bool:
        """Whether the host looks every ``handover_within / 4``: it needs units, or holds
        idle clients above its floor or units above its clients."""
        used = census.live + census.creating
        return demand > len(units) or census.idle > record.min_idle or len(units) > used

    def _give(
        self,
        coordinator: Coordinator,
        record: Record,
        units: list[Any],
        census: Census,
        demand: int,
    ) -> list[Any]:
        """Lower the cap for the hosts that need units, and give back the units above the
        clients (the idle clients above the new cap are retired by their owners); the
        units kept.

        The host keeps at most its demand, and gives one unit more while it holds two
        more than the poorest host that needs units: saturated hosts converge to equal
        shares, a host with little demand keeps only that.
        """
        poorest = min(post.held for post in self._needing)
        cap = min(demand, len(units) - 1 if len(units) > poorest + 1 else len(units))
        if cap >= min(self._board.read().cap, len(units)):
            return units
        return self._release_above(coordinator, record, units, cap)

    def _release_above(
        self, coordinator: Coordinator, record: Record, units: list[Any], cap: int
    ) -> list[Any]:
        """Lower the cap to ``cap`` and give back the units above ``max(cap, clients)``
        (:meth:`Board.shrink`); the units kept."""
        table = self._pool._t()

        def used() -> int:
            counted = key_census(table, self._key)
            return counted.live + counted.creating

        taken = self._board.shrink(self.me, cap, used)
        if taken is None:
            raise _Deposed
        self._bump()  # the owners retire the idle clients above the cap
        if not taken:
            return units
        grants = [grant for packed in taken if (grant := coordinator.unpack(packed))]
        self._due()
        coordinator.release(record.host, grants)
        self._looked_at = 0  # the posts change: look again soon
        return units[: len(units) - len(taken)]

    def _grow(
        self, coordinator: Coordinator, units: list[Any], demand: int, now: int
    ) -> tuple[list[Any], Record]:
        """Raise the cap within the units held, then take units while the host's demand
        is above them, the coordinator grants them, and no host that needs units is
        poorer by two (it gets the units freed first)."""
        record = self._board.read()
        if record.cap < min(len(units), demand):
            self._write(cap=min(len(units), demand))
            self._bump()
        if demand <= len(units) or now - self._tried_at < _ns(self.budget.look_every):
            return units, self._board.read()
        self._tried_at = now
        poorest = min((post.held for post in self._needing), default=UNITS_MAX)
        deadline = record.deadline_ns
        while demand > len(units) < min(UNITS_MAX, poorest + 1):
            self._due()
            sent = boot_ns()
            grant = coordinator.acquire(record.host)
            if grant is None:
                break
            if not units:
                deadline = deadline_after(sent, self.budget.ttl)
                self._renewed_at = sent
            units.append(grant)
            self._write(
                units=[coordinator.pack(unit) for unit in units],
                deadline_ns=deadline,
                cap=min(len(units), demand),
            )
            self._bump()
        return units, self._board.read()

    def _post(
        self,
        coordinator: Coordinator,
        record: Record,
        units: list[Any],
        census: Census,
        need: int,
        now: int,
    ) -> None:
        """Post the host's numbers when the units held or whether it needs any changed (at
        most every look), and at least every ``ttl / 4``."""
        decisive = (len(units), need > 0)
        age = now - self._posted_at
        changed = decisive != self._post_sent and age >= _ns(self.budget.look_every)
        if self._posted is not None and not changed and age < _ns(self.budget.renew_every):
            return
        waiting = sum(census.waiters)
        numbers = (len(units), census.live - census.idle, census.idle, waiting, need)
        post = Post(record.host, record.total, record.max_live, *numbers)
        self._due(2)  # a new post, then the old one down
        posted = coordinator.post(post, self._posted)
        if posted is not None:
            self._posted, self._post_sent, self._posted_at = posted, decisive, now
            self._write(post=[posted[0], coordinator.pack(posted[1])])

    def _next_due(self, census: Census, record: Record, units: list[Any], demand: int) -> float:
        """Seconds until the next renewal, post or look is due."""
        budget = self.budget
        every = (
            budget.look_every if self._eager(census, record, units, demand) else budget.renew_every
        )
        due = [self._posted_at + _ns(budget.renew_every), self._looked_at + _ns(every)]
        if units:
            due.append(self._renewed_at + _ns(budget.renew_every))
        return max(0.0, (min(due) - boot_ns()) / 1e9)

    # -- the record ------------------------------------------------------------------------

    def _due(self, calls: int = 1) -> None:
        """Extend the stewardship lease over the next ``calls`` coordinator calls."""
        budget = self.budget
        if not self._board.beat(self.me, _ns(calls * budget.call_timeout + budget.steward_grace)):
            raise _Deposed

    @property
    def running(self) -> bool:
        """Whether the thread still runs (it ends when stopped or deposed)."""
        return self._thread.is_alive()

    def _write(self, **changes: Any) -> None:
        if not self._board.write(self.me, **changes):
            raise _Deposed

    def _bump(self) -> None:
        bump(self._pool._t(), self._key)

    # -- the end ------------------------------------------------------------------------------

    def stop(self) -> None:
        """End the thread after its round (it does not wait). Idempotent."""
        self._stop.set()

    def close(self) -> None:
        """End the thread, give back the units no client of the host uses, take the post
        down, and stop being the steward (another process of the host then takes over
        the rest). Waits at most one coordinator call per step."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        coordinator = self._coordinator
        with contextlib.suppress(OrbitError, OSError):
            if coordinator is not None and self._board.read().steward == self.me:
                self._give_back(coordinator)  # a deposed steward leaves them to its successor
        self._board.resign(self.me)
        if coordinator is not None:
            coordinator.close()
        self._pool.close()

    def _give_back(self, coordinator: Coordinator) -> None:
        """The host's last clients are gone: give every unit and the post back. While it
        has clients, leave both to the next steward."""
        table = self._pool._t()

        def used() -> int:
            counted = key_census(table, self._key)
            return counted.live + counted.creating

        if used():
            return
        record = self._board.read()
        taken = self._board.shrink(self.me, 0, used)
        if taken:
            grants = [grant for packed in taken if (grant := coordinator.unpack(packed))]
            coordinator.release(record.host, grants)
        posted = self._posted or (record.post and _posted(coordinator, record.post))
        if posted:
            coordinator.unpost(posted)
            self._board.write(self.me, post=None)


class _Deposed(Exception):
    """This process is no longer the steward: the thread ends."""


def _demand(census: Census, record: Record) -> int:
    """Clients the host could use now: in use, being created and waited for, at least its
    floor, at most its ``max_live``."""
    in_use = census.live - census.idle
    wanted = max(in_use + census.creating + sum(census.waiters), record.min_idle)
    return min(record.max_live, wanted)


def _posted(coordinator: Coordinator, packed: list[Any]) -> Posted | None:
    """The post a record carries, as the coordinator takes it down."""
    if len(packed) == 2 and isinstance(packed[0], str):
        grant = coordinator.unpack(packed[1])
        if grant is not None:
            return packed[0], grant
    return None


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)
