"""Prometheus metrics of a fleet, read straight from its shared memory.

A fleet's state is host-wide already: the pool table counts every process's
clients, waiters and waits, the lock tables their leases and conflicts. So one
collector, in any one process, exports the whole host; it needs neither
prometheus_client's multiprocess mode (which takes no custom collector,
client_python #886 and #653) nor a membership: it reads the tables as an
observer, so a sidecar that never joins the fleet can serve it, and so can any
worker of a gunicorn fleet::

    from prometheus_client import REGISTRY, start_http_server
    from orbitive.metrics import FleetCollector

    REGISTRY.register(FleetCollector("web"))
    start_http_server(9100)

Client pools (one series per pool key a live process uses, named by its label), with
OpenTelemetry's semantic names for database connection pools mapped to
Prometheus's (dots to underscores, the unit as a suffix, ``_total`` on
counters; attributes as labels: ``db_client_connection_pool_name``,
``db_client_connection_state``):

======================================================  =========  ==========================
``db_client_connection_count{state="idle"|"used"}``     gauge      live connections of live
                                                                   owners, idle or in use
``db_client_connection_max``                            gauge      ``max_live`` (host-wide)
``db_client_connection_idle_max``                       gauge      ``max_idle`` (host-wide)
``db_client_connection_idle_min``                       gauge      ``min_idle`` (host-wide)
``db_client_connection_pending_requests``               gauge      callers waiting at
                                                                   ``max_live``
``db_client_connection_timeouts_total``                 counter    checkouts that gave up at
                                                                   ``max_live``
``db_client_connection_wait_time_seconds``              histogram  the waits of checkouts that
                                                                   waited at ``max_live``
``orbitive_pool_creating``                              gauge      creations claimed, not done
``orbitive_pool_dead_connections``                      gauge      connections of dead owners
                                                                   not reported yet
======================================================  =========  ==========================

A key is a client pool once a client pool described it (wrote its limits);
the keys of a plain :class:`~orbitive.pool.Pool` are resource pools, with
families of their own (label ``pool``: the name ``Pool.label_key`` gave, or the
key's digest):

======================================================  =========  ==========================
``orbitive_resource_pool_resources``                    gauge      live resources of live
                                                                   owners
``orbitive_resource_pool_units{state="idle"|"used"}``   gauge      their units, free or
                                                                   reserved and active
``orbitive_resource_pool_creating``                     gauge      creations claimed, not done
======================================================  =========  ==========================

Only keys a live process has a stake in are listed: a live resource of a live
owner, a creation claim, a waiting caller or an open client pool of a live node.
So a client pool's key is listed from its opening to its closing in every live
process, with counts of 0 while its pools hold nothing (before the first
checkout, or once every client was retired); a plain ``Pool``'s key while it
holds something. The keys of processes that exited (a key stays in the table
for its epoch) are not listed; what owners that died still hold
shows as ``orbitive_pool_dead_connections`` (client pools) and
``orbitive_resource_pool_dead_resources`` until the death is reported.

The limits are those of the client pool opened last on the key. The wait
time is recorded only for checkouts that had to wait at ``max_live``: one
served at once (almost all of them) adds nothing, so the histogram describes
the waits, not every checkout. Counters and the histogram start again at 0 when
the table's epoch changes.

Budgets across hosts (one series per budget the host's pools name, labelled
as its pool key): ``orbitive_budget_total``, ``orbitive_budget_units`` (units
this host holds), ``orbitive_budget_cap`` (connections it may hold now) and
``orbitive_budget_lapse_seconds`` (how long its units are surely held, by its
own clock; 0 when it holds none).

Lock tables (the fleet's ``LockTable`` and its ``shm://`` store's, label
``table``: ``locks`` or ``store``): ``orbitive_lock_leases`` (live leases),
``orbitive_lock_acquisitions_total``, ``orbitive_lock_conflicts_total``
(``try_acquire`` answered ``Occupied``) and ``orbitive_lock_recoveries_total``
(the section's stripe mutexes repaired after their holder died).

Every series carries ``fleet``. Needs the ``metrics`` extra (prometheus_client).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Final, final

try:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
except ImportError as error:  # pragma: no cover - the extra is installed in the tests
    raise ModuleNotFoundError(
        "orbitive.metrics needs prometheus_client: pip install 'orbitive[metrics]'",
        name="prometheus_client",
    ) from error

from ._core._errors import MalformedError, shown
from ._core._fleet import check_fleet_name
from .clients._board import observe_board
from .lock._layout import DEFAULT_STATE_KIND, STORE_STATE_KIND
from .lock._tables import open_tables
from .pool import POOL_KIND
from .pool._observer import KeyCounts, Observation, observe
from .pool._stats import WAIT_BOUNDS_S, KeyStatistics

__all__ = ["FleetCollector"]

#: The label of the pool a series belongs to, and of a connection's state (OpenTelemetry's
#: ``db.client.connection.pool.name`` and ``db.client.connection.state``).
POOL_NAME: Final = "db_client_connection_pool_name"
STATE: Final = "db_client_connection_state"
#: The lock tables by their state kinds, as the ``table`` label names them.
TABLE_NAMES: Final = {DEFAULT_STATE_KIND: "locks", STORE_STATE_KIND: "store"}


@final
class FleetCollector:
    """A Prometheus collector of one fleet's client pools and lock tables.

    Every scrape attaches to the fleet's tables read-only, as an observer (no
    node is held, nothing is written), reads them and lets go. A fleet with no
    pool table or no lock table exports none of its series.

    Args:
        fleet: the fleet's name.
        pool_kind: the kind number of its pool table (default 247).

    Raises:
        InvalidName: ``fleet`` is not a fleet name.
        MalformedError: ``pool_kind`` is not an int in 0..255 (as ``Pool`` says it).

    A scrape (``collect``) raises ``LayoutMismatch`` when an object is not a
    table of this release's layout, and ``AccessDenied`` when one is not the
    user's own.
    """

    def __init__(self, fleet: str, *, pool_kind: int = POOL_KIND) -> None:
        self.fleet = check_fleet_name(fleet)
        if type(pool_kind) is not int or not 0 <= pool_kind <= 255:
            raise MalformedError(f"pool kind must be an int in 0..255, got {shown(pool_kind)}")
        self.pool_kind = pool_kind

    def describe(self) -> Iterable[Metric]:
        """The metric families this collector yields, without samples (the registry
        checks their names once, and never scrapes to learn them)."""
        return [
            *_pool_families(self.fleet),
            *_resource_families(self.fleet),
            *_budget_families(self.fleet),
            *_lock_families(self.fleet),
        ]

    def collect(self) -> Iterator[Metric]:
        """Read the fleet's tables now and yield their metric families."""
        observation = observe(self.fleet, self.pool_kind)
        if observation is not None:
            yield from _pool_families(self.fleet, observation)
            yield from _resource_families(self.fleet, observation)
            yield from _budget_families(self.fleet, observation)
        yield from _lock_families(self.fleet, read=True)

    def __repr__(self) -> str:
        return f"<FleetCollector fleet={self.fleet!r} pool_kind={self.pool_kind}>"


def _pool_families(fleet: str, observation: Observation | None = None) -> Iterator[Metric]:
    """The client pools' families; empty (for ``describe``) when ``observation`` is None."""
    labels = ["fleet", POOL_NAME]
    count = GaugeMetricFamily(
        "db_client_connection_count",
        "Connections in the state the state label names (idle or used), host-wide",
        labels=[*labels, STATE],
    )
    limits = [
        GaugeMetricFamily(
            "db_client_connection_max", "Most open connections allowed (max_live)", labels=labels
        ),
        GaugeMetricFamily(
            "db_client_connection_idle_max", "Most idle connections kept (max_idle)", labels=labels
        ),
        GaugeMetricFamily(
            "db_client_connection_idle_min", "Idle connections kept warm (min_idle)", labels=labels
        ),
    ]
    pending = GaugeMetricFamily(
        "db_client_connection_pending_requests",
        "Checkouts waiting for a connection at max_live",
        labels=labels,
    )
    timeouts = CounterMetricFamily(
        "db_client_connection_timeouts",
        "Checkouts that gave up waiting for a connection at max_live",
        labels=labels,
    )
    wait = HistogramMetricFamily(
        "db_client_connection_wait_time",
        "Time a checkout that waited at max_live took to get a connection",
        labels=labels,
        unit="seconds",
    )
    creating = GaugeMetricFamily(
        "orbitive_pool_creating", "Connections being created (claims held)", labels=labels
    )
    dead = GaugeMetricFamily(
        "orbitive_pool_dead_connections",
        "Connections of owners that died, not reported yet",
        labels=labels,
    )
    if observation is not None:
        names = observation.names()
        for key in observation.statistics.keys:
            values = [fleet, names[key.key]]
            counts = observation.counts(key)
            if not key.max_live:
                continue  # a resource pool: _resource_families
            if counts.dead:
                dead.add_metric(values, counts.dead)
            if not _held_live(observation, key, counts):
                continue
            count.add_metric([*values, "idle"], counts.idle)
            count.add_metric([*values, "used"], counts.in_use)
            if key.max_live:
                for family, limit in zip(
                    limits, (key.max_live, key.max_idle, key.min_idle), strict=True
                ):
                    family.add_metric(values, limit)
            pending.add_metric(values, key.waiting)
            timeouts.add_metric(values, key.timeouts_count)
            wait.add_metric(values, _buckets(key.wait_buckets, key.waits_count), key.waited_s)
            creating.add_metric(values, key.creating)
    yield from (count, *limits, pending, timeouts, wait, creating, dead)


def _held_live(observation: Observation, key: KeyStatistics, counts: KeyCounts) -> bool:
    """Whether a live process has a stake in ``key``: a live resource of a live owner,
    or a creation claim, a waiting caller or an open client pool of a node whose holder
    is alive."""
    if counts.live:
        return True
    nodes = {node for node, _ in observation.alive}
    stakes = (*(node for node, _ in (*key.claims, *key.waiters)), *key.opened)
    return any(node in nodes for node in stakes)


def _resource_families(fleet: str, observation: Observation | None = None) -> Iterator[Metric]:
    """The resource pools' families (keys no client pool described); empty (for
    ``describe``) when ``observation`` is None."""
    labels = ["fleet", "pool"]
    resources = GaugeMetricFamily(
        "orbitive_resource_pool_resources", "Live resources of live owners", labels=labels
    )
    units = GaugeMetricFamily(
        "orbitive_resource_pool_units",
        "Units of live resources, free (idle) or reserved and active (used)",
        labels=[*labels, "state"],
    )
    creating = GaugeMetricFamily(
        "orbitive_resource_pool_creating", "Resources being created (claims held)", labels=labels
    )
    dead = GaugeMetricFamily(
        "orbitive_resource_pool_dead_resources",
        "Resources of owners that died, not reported yet",
        labels=labels,
    )
    if observation is not None:
        names = observation.names()
        for key in observation.statistics.keys:
            if key.max_live:
                continue  # a client pool: _pool_families
            values = [fleet, names[key.key]]
            counts = observation.counts(key)
            if counts.dead:
                dead.add_metric(values, counts.dead)
            if not _held_live(observation, key, counts):
                continue
            resources.add_metric(values, counts.live)
            units.add_metric([*values, "idle"], counts.idle)
            units.add_metric([*values, "used"], _used_units(observation, key))
            creating.add_metric(values, key.creating)
    yield from (resources, units, creating, dead)


def _used_units(observation: Observation, key: KeyStatistics) -> int:
    """Units of ``key``'s live resources of live owners that are reserved or active."""
    return sum(
        res.reserved + res.active
        for res in observation.statistics.resources
        if res.key == key.key
        and res.state == "live"
        and (res.owner_node, res.owner_incarnation) in observation.alive
    )


def _budget_families(fleet: str, observation: Observation | None = None) -> Iterator[Metric]:
    """The budgets' families, per budget the host's pools name; empty (for ``describe``)
    when ``observation`` is None."""
    labels = ["fleet", POOL_NAME]
    total = GaugeMetricFamily(
        "orbitive_budget_total", "Connections the budget allows across every host", labels=labels
    )
    units = GaugeMetricFamily(
        "orbitive_budget_units", "Units of the budget this host holds", labels=labels
    )
    cap = GaugeMetricFamily(
        "orbitive_budget_cap", "Connections this host may hold now under the budget", labels=labels
    )
    lapse = GaugeMetricFamily(
        "orbitive_budget_lapse",
        "How long this host's units are surely held, by its own clock",
        labels=labels,
        unit="seconds",
    )
    if observation is not None:
        names = observation.names()
        for seen in observe_board(fleet):
            values = [fleet, names.get(seen.key, str(seen.key))]
            total.add_metric(values, seen.total)
            units.add_metric(values, seen.units)
            cap.add_metric(values, seen.cap)
            lapse.add_metric(values, seen.lapse_s)
    yield from (total, units, cap, lapse)


def _buckets(counts: tuple[int, ...], total: int) -> list[tuple[str, float]]:
    """Cumulative ``(le, count)`` pairs from per-bucket counts, ``+Inf`` last."""
    buckets, running = [], 0
    for bound, count in zip(WAIT_BOUNDS_S, counts, strict=True):
        running += count
        buckets.append((f"{bound:g}", float(running)))
    buckets.append(("+Inf", float(total)))
    return buckets


def _lock_families(fleet: str, *, read: bool = False) -> Iterator[Metric]:
    """The lock tables' families; read from the fleet's tables when ``read``."""
    labels = ["fleet", "table"]
    leases = GaugeMetricFamily("orbitive_lock_leases", "Live leases held", labels=labels)
    acquisitions = CounterMetricFamily(
        "orbitive_lock_acquisitions", "Leases granted (the last fencing token)", labels=labels
    )
    conflicts = CounterMetricFamily(
        "orbitive_lock_conflicts", "try_acquire calls that found a live holder", labels=labels
    )
    recoveries = CounterMetricFamily(
        "orbitive_lock_recoveries",
        "Critical-section mutexes repaired after their holder died",
        labels=labels,
    )
    if read:
        with open_tables(fleet, observe=True) as tables:
            for table in tables:
                stats = table.statistics()
                kind = table.layout.state_kind
                values = [fleet, TABLE_NAMES.get(kind, f"kind {kind}")]
                leases.add_metric(values, stats.occupied_count)
                acquisitions.add_metric(values, stats.last_fencing_token)
                conflicts.add_metric(values, stats.conflicts_count)
                recoveries.add_metric(values, stats.recoveries_count)
    yield from (leases, acquisitions, conflicts, recoveries)
