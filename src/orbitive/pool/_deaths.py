"""Noticing members that died, so their resources and claims come back unsupervised.

Facts this relies on:

* A member holds its node by ``flock`` on the node's lock file; the kernel drops
  it when the process dies, SIGKILL included. ``fleet.is_alive(node)`` is
  "someone holds that lock now".
* Every Pool stamps its incarnation in its node's doorbell when it binds, and
  lives on one node follow each other. So a life that owns resources on a node
  is over when the node is free, or when the doorbell shows another life (a
  newer process took the node and opened the pool). A node held by a process
  that has not opened the pool yet keeps the old life until it does: the scan
  never reports a life it cannot prove dead.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import final

from .._errors import OrbitError
from .._fleet import Fleet
from ._table import Table


def find_dead(table: Table, fleet: Fleet) -> list[tuple[int, int]]:
    """(node, incarnation) lives in the table that are provably over."""
    lives = table.lives()  # resources first, doorbells after: see the module docstring
    for node in range(table.fleet_capacity):
        bell = table.doorbell(node)
        if bell:
            lives.setdefault(node, set()).add(bell)
    dead = []
    for node, incarnations in sorted(lives.items()):
        if node == table.node:
            dead += [(node, life) for life in sorted(incarnations) if life != table.incarnation]
            continue
        alive = fleet.is_alive(node)
        bell = table.doorbell(node)
        dead += [(node, life) for life in sorted(incarnations) if not alive or life != bell]
    return dead


@final
class DeathWatch:
    """A daemon thread that reports dead members every ``interval`` seconds.

    Build it with ``Pool.watch_deaths``. ``reported`` lists every life reported
    so far; ``close()`` (or leaving the ``with`` block) stops the thread.
    """

    def __init__(
        self,
        reap: Callable[[], list[tuple[int, int]]],
        interval: float,
        on_death: Callable[[int, int], None] | None,
    ) -> None:
        self.interval = interval
        self.reported: list[tuple[int, int]] = []
        self._reap = reap
        self._on_death = on_death
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="orbit-pool-deaths", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(OrbitError, OSError):
                for node, life in self._reap():
                    self.reported.append((node, life))
                    if self._on_death is not None:
                        self._on_death(node, life)

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
