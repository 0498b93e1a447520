"""Member deaths: reporting a life over, finding the lives that are, watching for more.

A reported death closes the resources that life owned and returns its creation
claims, so they come back unsupervised.

Facts this relies on:

* A member holds its node by an OFD lock on the fleet's membership object; the
  kernel drops it when the process dies, SIGKILL included. Right after its
  claim the member records its fleet incarnation in the node's word there, and
  a node's incarnations only grow. ``fleet.incarnation_of(node)`` is the
  holder's incarnation, None while nobody holds the node.
* Every Pool stamps its incarnation in its node's doorbell when it binds, and
  its fleet incarnation beside it (the bell's life; the two are equal unless
  the Pool was given an incarnation of its own). Lives on one node follow each
  other. So a life that owns resources on a node is over when the doorbell
  shows another life (a newer process took the node and opened the pool), or
  when the bell's own life is over: the node is free, or its holder recorded
  another fleet incarnation than the bell's (a newer process took the node and
  opened no pool, as ``orbit run --store shm://`` does). A newer holder that
  has not recorded its incarnation yet keeps the old life for that instant:
  the scan never reports a life it cannot prove over.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Callable
from typing import final

from .._core._errors import MalformedError, NodeOutsideFleet, OrbitError, shown
from .._core._fleet import Fleet
from . import _snapshots
from ._stats import PoolStatistics
from ._table import Table
from ._values import U64_MAX, Incarnation, check_seconds

_log = logging.getLogger("orbitive.pool")


def node_dead(table: Table, node: int, incarnation: int | Incarnation) -> int:
    """:meth:`Pool.node_dead`: check the life, then close its resources (raises as it documents)."""
    if type(node) is not int or not 0 <= node < table.fleet_capacity:
        raise NodeOutsideFleet(f"node must be in 0..{table.fleet_capacity - 1}, got {shown(node)}")
    if type(incarnation) is Incarnation:
        incarnation = incarnation.value
    elif type(incarnation) is not int or not 1 <= incarnation <= U64_MAX:
        raise MalformedError(
            f"incarnation must be an int in 1..{U64_MAX} or an Incarnation, "
            f"got {shown(incarnation)}"
        )
    return table.node_dead(node, incarnation)


def reap_dead(table: Table, fleet: Fleet) -> list[tuple[int, int]]:
    """:meth:`Pool.reap_dead`: report every life :func:`find_dead` proves over, and log it
    (``orbitive.pool``: WARNING for a life that left resources behind, INFO otherwise)."""
    dead = find_dead(table, fleet)
    for node, life in dead:
        closed = table.node_dead(node, life)
        gone = "pool of fleet %r (kind %d): the process on node %d (incarnation %d) is gone"
        if closed:
            _log.warning(
                gone + "; closed the %d resource(s) it left (its share of max_live is free)",
                fleet.name, table.kind, node, life, closed,
            )  # fmt: skip
        else:
            _log.info(gone + "; it left no resource", fleet.name, table.kind, node, life)
    return dead


def find_dead(table: Table, fleet: Fleet) -> list[tuple[int, int]]:
    """(node, incarnation) lives in the table that are provably over."""
    lives = _snapshots.lives(table)  # resources first, doorbells after: see the module docstring
    for node in range(table.fleet_capacity):
        bell = table.doorbell(node)
        if bell:
            lives.setdefault(node, set()).add(bell)
    dead = []
    for node, incarnations in sorted(lives.items()):
        if node == table.node:
            dead += [(node, life) for life in sorted(incarnations) if life != table.incarnation]
            continue
        bell = table.doorbell(node)
        over = bell_over(fleet, node, table.bell_life(node))
        dead += [(node, life) for life in sorted(incarnations) if over or life != bell]
    return dead


def live_lives(statistics: PoolStatistics, fleet: Fleet) -> set[tuple[int, int]]:
    """The (node, incarnation) lives of a table snapshot that are not over (as
    :func:`find_dead` judges them, for an observer such as ``orbit pool``)."""
    bell_lives = dict(statistics.bell_lives)
    return {
        (node, life)
        for node, life in statistics.members
        if not bell_over(fleet, node, bell_lives.get(node, 0))
    }


def bell_over(fleet: Fleet, node: int, bell_life: int) -> bool:
    """Whether the process that rang ``node``'s doorbell, of fleet incarnation
    ``bell_life``, is gone: nobody holds the node, or a newer life does."""
    return fleet.incarnation_of(node) != bell_life or not bell_life


def check_interval(interval: object) -> float:
    """Return ``interval`` as float seconds if a thread can wait that long between scans.

    Raises:
        MalformedError: not seconds as :func:`check_seconds` takes them (at most
            1e9), not above zero, or above ``threading.TIMEOUT_MAX``.
    """
    seconds = check_seconds(interval, "interval")
    if not 0 < seconds <= threading.TIMEOUT_MAX:
        raise MalformedError(
            f"interval must be > 0 and <= {threading.TIMEOUT_MAX:g} seconds, got {shown(interval)}"
        )
    return seconds


@final
class DeathWatch:
    """A daemon thread that reports dead members at once, then every ``interval`` seconds.

    Build it with ``Pool.watch_deaths``. ``reported`` lists every life reported
    so far; ``close()`` (or leaving the ``with`` block) stops the thread.

    The thread outlives failures: an exception raised by ``on_death`` (for one
    life; the others are still called) or a scan failing with anything but an
    :class:`~orbitive.OrbitError` or ``OSError`` (those are skipped quietly
    until the next scan) is handed to :func:`threading.excepthook`, which prints
    it by default, and the watch goes on. ``failures`` counts them.

    Args:
        reap: one scan; returns the (node, incarnation) lives it reported.
        interval: seconds between scans, > 0 and <= 1e9 (and <= ``threading.TIMEOUT_MAX``).
        on_death: called with (node, incarnation) for each life reported, or None.

    Raises:
        MalformedError: ``interval`` out of range, or ``on_death`` not callable.
    """

    def __init__(
        self,
        reap: Callable[[], list[tuple[int, int]]],
        interval: float,
        on_death: Callable[[int, int], None] | None,
    ) -> None:
        if on_death is not None and not callable(on_death):
            raise MalformedError(f"on_death must be callable or None, got {shown(on_death)}")
        self.interval = check_interval(interval)
        self.reported: list[tuple[int, int]] = []
        self.failures = 0
        self._reap = reap
        self._on_death = on_death
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orbit-pool-deaths", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():  # the first scan at once, then one per interval
            self._scan()
            self._stop.wait(self.interval)

    def _scan(self) -> None:
        try:
            dead = self._reap()
        except (OrbitError, OSError):
            return  # a table or fleet that cannot be read now: try the next scan
        except Exception:  # reported below; the watch must go on
            self._report()
            return
        for node, life in dead:
            self.reported.append((node, life))
            self._tell(node, life)

    def _tell(self, node: int, life: int) -> None:
        if self._on_death is None:
            return
        try:
            self._on_death(node, life)
        except Exception:  # the caller's bug must not end the watch
            self._report()

    def _report(self) -> None:
        """Hand the exception being handled to ``threading.excepthook``."""
        self.failures += 1
        kind, error, trace = sys.exc_info()
        with contextlib.suppress(Exception):  # a failing hook must not end the watch either
            threading.excepthook(threading.ExceptHookArgs([kind, error, trace, self._thread]))

    def close(self) -> None:
        """Stop the thread and wait for it. Idempotent."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> DeathWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "stopped" if self._stop.is_set() else f"every {self.interval:g}s"
        return f"<DeathWatch {state} reported={len(self.reported)}>"
