"""``ClientPool.statistics()``: the key's fleet-wide counts and this process's counters."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import final

from .._core._fleet import Fleet
from ..pool import Key, Pool
from ..pool._availability import Census
from ..pool._deaths import find_dead


@dataclass(slots=True)
class Counters:
    """What this process's pool did since it was built (plain ints, no lock needed)."""

    requests: int = 0
    created: int = 0
    closed: int = 0
    retired: int = 0
    timeouts: int = 0
    refused: int = 0
    create_errors: int = 0
    check_failures: int = 0
    reset_failures: int = 0
    close_errors: int = 0
    borrowed: int = 0
    queued: int = 0
    waited_s: float = 0.0
    severed: int = 0


@final
@dataclass(frozen=True, slots=True)
class ClientPoolStatistics:
    """One key of a client pool at one moment (what ``orbit pool`` shows per key).

    Fleet-wide (every process of the fleet): ``live`` clients registered by
    owners that are alive, ``idle`` of them, ``in_use`` (live - idle),
    ``waiting`` callers at ``max_live``, ``creating`` claims in progress, and
    ``dead_owners_count``: clients still listed for processes that died and
    were not reported yet (reported within the upkeep interval, 0.2 s).

    This process: ``local_idle``, ``local_in_use``, ``local_waiting``, then the
    ``*_count`` counters since the pool was built (``borrowed_count``: remote
    requests another process's client served; ``queued_count``: checkouts that
    waited at ``max_live``, whatever came of it (an asyncio checkout that queued
    in its loop's gate and then at the key's ``max_live`` counts twice),
    ``waited_s`` their waits, in seconds; ``severed_count``: clients in use whose
    budget units were lapsing, severed under their caller).

    With a :class:`~orbitive.clients.Budget` (all 0 without): ``budget_total``,
    the units the host holds (``budget_units``), the cap its clients keep to now
    (``budget_cap``: the units, less those being given back, 0 once they may
    lapse), and ``budget_lapse_ms``, how long the units are surely held by this
    host's clock (0 when it holds none).
    """

    max_live: int
    live: int
    idle: int
    in_use: int
    waiting: int
    creating: int
    dead_owners_count: int
    local_idle: int
    local_in_use: int
    local_waiting: int
    requests_count: int
    created_count: int
    closed_count: int
    retired_count: int
    timeouts_count: int
    refused_count: int
    create_errors_count: int
    check_failures_count: int
    reset_failures_count: int
    close_errors_count: int
    borrowed_count: int
    queued_count: int
    waited_s: float
    severed_count: int = 0
    budget_total: int = 0
    budget_units: int = 0
    budget_cap: int = 0
    budget_lapse_ms: int = 0

    def as_dict(self) -> dict[str, float]:
        """The numbers by name, for a metrics exporter."""
        return {field.name: getattr(self, field.name) for field in fields(self)}


def collect(
    handle: Pool,
    fleet: Fleet,
    key: Key,
    counted: Census,
    max_live: int,
    local: tuple[int, int, int],
    counters: Counters,
    budget: tuple[int, int, int, int] = (0, 0, 0, 0),
) -> ClientPoolStatistics:
    """The statistics of ``key``: its census, less the clients of dead lives the table
    still lists, with this process's idle, in-use and waiting counts (``local``) and
    its counters, and its ``budget`` numbers (total, units, cap, lapse in ms).

    Raises:
        FleetError: ``handle`` or ``fleet`` is closed.
    """
    dead = set(find_dead(handle._t(), fleet))
    dead_clients = sum(
        1
        for candidate in handle.candidates(key)
        if candidate.state == "live" and (candidate.owner_node, candidate.owner_incarnation) in dead
    )
    live = counted.live - dead_clients
    return ClientPoolStatistics(
        max_live,
        live,
        min(counted.idle, live),
        max(0, live - counted.idle),
        sum(counted.waiters),
        counted.creating,
        dead_clients,
        *local,
        counters.requests,
        counters.created,
        counters.closed,
        counters.retired,
        counters.timeouts,
        counters.refused,
        counters.create_errors,
        counters.check_failures,
        counters.reset_failures,
        counters.close_errors,
        counters.borrowed,
        counters.queued,
        counters.waited_s,
        counters.severed,
        *budget,
    )
