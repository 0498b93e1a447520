"""The client pool's upkeep thread: death watch, no stranding, timeouts, warm floor.

One daemon thread per ClientPool per process. Each round:

1. reports members that died (``Pool.reap_dead``), so their clients and
   creation claims return without a supervisor (at most every interval);
2. retires this process's idle clients while another process waits at
   ``max_live`` (``retire_idle(FOR_WAITER)``): the waiter can then create.
   A client whose turn is over (``handoff_after``, ``handoff_uses``) goes at once, any other
   after :data:`HANDOFF_GRACE_S` of idleness;
3. retires clients idle longer than ``idle_timeout`` (above the ``min_idle``
   floor) or older than ``max_lifetime``;
4. refills the ``min_idle`` floor, claiming only this process's share of the
   fleet-wide deficit (``claim_warm``).

While the process holds idle clients the thread sleeps on the key's version
word, so a waiter elsewhere (which bumps the key when it starts waiting) is
noticed at once; otherwise it sleeps for the interval. Rounds are at least
:data:`MIN_ROUND_S` apart, so a busy key does not keep it spinning.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Final

from .._core._errors import CreationBudgetError, OrbitError
from ..pool import CreationPermit
from ..pool._availability import (
    FOR_IDLE_TIMEOUT,
    FOR_LIFETIME,
    FOR_WAITER,
    claim_warm,
    retire_idle,
)
from ._callbacks import run_anywhere
from ._entry import Entry
from ._options import HANDOFF_GRACE_S

if TYPE_CHECKING:
    from ._client_pool import ClientPool

#: Shortest time between two rounds (a woken thread with nothing to do rests).
MIN_ROUND_S: Final = 0.01


class Upkeep:
    """The upkeep thread of one ClientPool in this process."""

    def __init__(self, pool: ClientPool[Any], interval: float) -> None:
        self.interval = interval
        self.failures = 0
        self._pool = weakref.ref(pool)
        self._stop = threading.Event()
        self._last_reap = 0.0
        self._thread = threading.Thread(target=self._run, name="orbit-clients-upkeep", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            pool = self._pool()
            if pool is None or pool._closed:
                return
            try:
                self._round(pool)
                self._sleep(pool)
            except (OrbitError, OSError):
                self._stop.wait(self.interval)  # a table or fleet that cannot be read now
            except Exception:  # reported; the upkeep must go on
                self._report()
                self._stop.wait(self.interval)
            del pool

    def _sleep(self, pool: ClientPool[Any]) -> None:
        self._stop.wait(MIN_ROUND_S)
        if pool._idle and not self._stop.is_set():
            version = pool.pool.version(pool.key)
            pool.pool.wait_capacity(pool.key, version, self.interval)
        else:
            self._stop.wait(self.interval)

    def _round(self, pool: ClientPool[Any]) -> None:
        now = time.monotonic()
        if now - self._last_reap >= self.interval:
            self._last_reap = now
            pool.pool.reap_dead()
        options = pool.options
        if pool._idle:
            self._retire_all(
                pool,
                FOR_WAITER,
                lambda e: not pool._in_turn(e, now) or now - e.idle_since >= HANDOFF_GRACE_S,
            )
            self._retire_all(
                pool, FOR_IDLE_TIMEOUT, lambda e: now - e.idle_since >= options.idle_timeout
            )
            self._retire_all(
                pool, FOR_LIFETIME, lambda e: now - e.created_at >= options.max_lifetime
            )
        if options.min_idle:
            self._refill(pool)

    def _retire_all(self, pool: ClientPool[Any], reason: int, due: Any) -> None:
        """Retire idle entries, oldest first, while ``due(entry)`` and the table agrees."""
        options = pool.options
        for entry in list(pool._idle):
            if not due(entry):
                continue
            with pool._lock:
                if entry not in pool._idle:
                    continue
                retired = retire_idle(
                    pool.table, entry.rid, reason, options.max_live, options.min_idle
                )
                if retired:
                    pool._idle.remove(entry)
            if not retired:
                return
            pool._retire(entry)

    def _refill(self, pool: ClientPool[Any]) -> None:
        """Create idle clients while this process may claim part of the warm deficit."""
        options, table = pool.options, pool.table
        while not self._stop.is_set() and not pool._closed:
            try:
                claimed = claim_warm(table, pool.key, options.max_live, options.min_idle)
            except CreationBudgetError:
                return
            permit = CreationPermit(table, pool.key, claimed)
            try:
                client = run_anywhere(pool._create)
            except Exception:
                permit.finish()
                pool.counters.create_errors += 1
                return
            self._add_idle(pool, permit, client)

    def _add_idle(self, pool: ClientPool[Any], permit: CreationPermit, client: object) -> None:
        with permit:
            try:
                rid = pool.table.register(pool.key, 1, 0)
            except BaseException:
                pool._close_quietly(client)
                raise
        now = time.monotonic()
        entry: Entry[Any] = Entry(client, rid, now, now)
        with pool._lock:
            pool._idle.insert(0, entry)
        pool.counters.created += 1

    def _report(self) -> None:
        self.failures += 1
        kind, error, trace = sys.exc_info()
        with contextlib.suppress(Exception):
            threading.excepthook(threading.ExceptHookArgs([kind, error, trace, self._thread]))

    def close(self) -> None:
        """Stop the thread and wait for it (at most one sleep). Idempotent."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
