"""``orbit pool FLEET``: keys, resources and creation claims of a fleet's pool table."""

from __future__ import annotations

import argparse

from .._core._region import object_name, object_size, read_prefix
from ..pool import POOL_KIND
from ..pool._layout import MAGIC
from ..pool._observer import Observation, observe
from ..pool._stats import WAIT_BOUNDS_S
from ._lock_commands import KNOWN_KINDS, fleet_name, kind_number
from ._store_commands import NothingFound, add_json_option, print_json


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``orbit pool`` to ``orbit``."""
    cmd = subparsers.add_parser("pool", help="show a fleet's resource pool table")
    cmd.add_argument("fleet", type=fleet_name, help="fleet name")
    cmd.add_argument(
        "--kind", type=kind_number, metavar="K", default=POOL_KIND,
        help=f"the pool's kind number (default {POOL_KIND})",
    )  # fmt: skip
    add_json_option(cmd)
    cmd.set_defaults(func=cmd_pool)


def cmd_pool(args: argparse.Namespace) -> int:
    """Attach read-only (no node, no lock held for long) and print the table."""
    name = object_name(args.fleet, args.kind)
    size = object_size(name)
    if size is not None and read_prefix(name, min(size, len(MAGIC))) != MAGIC:
        held = KNOWN_KINDS.get(args.kind)
        what = (
            f"the {held} (kind {args.kind}) of fleet {args.fleet!r} is not a resource pool table"
            if held is not None and args.kind != POOL_KIND
            else f"{name} is not a resource pool table: its header is not a pool table's"
        )
        raise NothingFound(f"{what} ('orbit list {args.fleet}' shows the fleet's objects)")
    observation = observe(args.fleet, args.kind)
    if observation is None:
        raise NothingFound(
            f"fleet {args.fleet!r} has no resource pool table (kind {args.kind}): "
            f"'orbit list {args.fleet}' shows its objects, 'orbit list' every fleet"
        )
    if args.json:
        print_json(as_json(observation))
    else:
        print("\n".join(format_statistics(observation)))
    return 0


def _life(life: tuple[int, int], alive: frozenset[tuple[int, int]]) -> str:
    return "alive" if life in alive else "dead"


def format_statistics(observation: Observation) -> list[str]:
    """The lines ``orbit pool`` prints for one snapshot.

    A resource whose owner node is dead stays in the table until its death is
    reported (``Pool.node_dead``, ``watch_deaths`` or a client pool's upkeep); the
    OWNER column says so, and the keys table counts it under DEAD, not LIVE.
    Per key, as PgBouncer's ``SHOW POOLS``: LIVE, IDLE and IN USE resources of
    live owners, WAITING callers at ``max_live``, CREATING claims, DEAD
    resources, TIMEOUTS (checkouts that gave up at ``max_live``). A key shows
    by its label, or by its digest when it has none. The totals add PARKED:
    nodes with a thread asleep on a key's version word (a waiting caller or a
    client pool's upkeep thread), which is not WAITING.
    """
    stats, alive = observation.statistics, observation.alive
    names = observation.names()
    width = max((len(name) for name in names.values()), default=0)
    width = max(32, min(width, 64))
    lines = [
        f"pool of fleet {stats.fleet!r}, kind {stats.kind}, epoch {stats.epoch}",
        f"  geometry    {stats.fleet_capacity} nodes x {stats.lane_capacity} resources, "
        f"{stats.key_capacity} keys",
        f"  totals      {stats.live_count} live, {stats.draining_count} draining, "
        f"{stats.reserved_count} reserved, {stats.active_count} active, "
        f"{stats.creating_count} creating, {stats.waiting_count} waiting, "
        f"{stats.parked_nodes_count} parked",
        "  members     "
        + (
            ", ".join(
                f"node {n} (incarnation {i}, {_life((n, i), alive)})" for n, i in stats.members
            )
            or "none"
        ),
        "",
        f"keys ({stats.keys_count})",
        f"  {'KEY':<{width}}  {'LIVE':>4}  {'IDLE':>4}  {'IN USE':>6}  {'WAITING':>7}  "
        f"{'CREATING':>8}  {'DEAD':>4}  {'TIMEOUTS':>8}  {'VERSION':>10}  CLAIMS",
    ]
    for key in stats.keys:
        claims = ", ".join(f"node {node}: {count}" for node, count in key.claims) or "-"
        counts = observation.counts(key)
        lines.append(
            f"  {names[key.key]:<{width}}  {counts.live:>4}  {counts.idle:>4}  "
            f"{counts.in_use:>6}  {key.waiting:>7}  {key.creating:>8}  {counts.dead:>4}  "
            f"{key.timeouts_count:>8}  {key.version:>10}  {claims}"
        )
    lines += [
        "",
        f"resources ({len(stats.resources)})",
        f"  {'ID':<14}  {'KEY':<{width}}  {'OWNER':<11}  {'INCARNATION':>20}  {'STATE':<8}  "
        f"{'CAP':>4}  {'RES':>4}  {'ACT':>4}  {'FENCE':>8}",
    ]
    for res in stats.resources:
        owner = f"{res.owner_node} {_life((res.owner_node, res.owner_incarnation), alive)}"
        lines.append(
            f"  {res.id!s:<14}  {names.get(res.key, str(res.key)):<{width}}  {owner:<11}  "
            f"{res.owner_incarnation:>20}  {res.state:<8}  {res.capacity:>4}  "
            f"{res.reserved:>4}  {res.active:>4}  {res.fence:>8}"
        )
    return lines


def as_json(observation: Observation) -> dict[str, object]:
    """``orbit pool --json``: the same snapshot as one JSON object.

    Keys of the object: ``fleet``, ``kind``, ``epoch``, ``geometry``, ``totals``
    (``waiting``: callers at ``max_live``; ``parked``: nodes asleep on a key),
    ``members``, ``keys`` (per key: ``key`` the digest in hex, ``label`` or
    null, the counts as the table shows them, ``claims`` and ``waiters`` per
    node, the wait counters), ``resources``.
    """
    stats, alive = observation.statistics, observation.alive
    keys = []
    for key in stats.keys:
        counts = observation.counts(key)
        keys.append(
            {
                "key": str(key.key),
                "label": key.label or None,
                "live": counts.live,
                "idle": counts.idle,
                "in_use": counts.in_use,
                "waiting": key.waiting,
                "creating": key.creating,
                "dead": counts.dead,
                "parked_nodes": key.parked_nodes,
                "version": key.version,
                "claims": [{"node": node, "count": count} for node, count in key.claims],
                "waiters": [{"node": node, "count": count} for node, count in key.waiters],
                "timeouts": key.timeouts_count,
                "waits": key.waits_count,
                "waited_s": key.waited_s,
                "wait_buckets": [
                    {"le_s": bound, "count": count}
                    for bound, count in zip(WAIT_BOUNDS_S, key.wait_buckets, strict=True)
                ],
            }
        )
    return {
        "fleet": stats.fleet,
        "kind": stats.kind,
        "epoch": stats.epoch,
        "geometry": {
            "fleet_capacity": stats.fleet_capacity,
            "lane_capacity": stats.lane_capacity,
            "key_capacity": stats.key_capacity,
        },
        "totals": {
            "live": stats.live_count,
            "draining": stats.draining_count,
            "reserved": stats.reserved_count,
            "active": stats.active_count,
            "creating": stats.creating_count,
            "waiting": stats.waiting_count,
            "parked": stats.parked_nodes_count,
        },
        "members": [
            {"node": node, "incarnation": life, "alive": (node, life) in alive}
            for node, life in stats.members
        ],
        "keys": keys,
        "resources": [
            {
                "id": str(res.id),
                "key": str(res.key),
                "owner_node": res.owner_node,
                "owner_incarnation": res.owner_incarnation,
                "owner_alive": (res.owner_node, res.owner_incarnation) in alive,
                "state": res.state,
                "capacity": res.capacity,
                "reserved": res.reserved,
                "active": res.active,
                "fence": res.fence,
                "last_reserve_at": res.last_reserve_at,
            }
            for res in stats.resources
        ],
    }
