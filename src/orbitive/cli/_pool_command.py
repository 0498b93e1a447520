"""``orbit pool FLEET``: keys, resources and creation claims of a fleet's pool table."""

from __future__ import annotations

import argparse

from .. import Fleet
from .._core._region import object_name, object_size, read_prefix
from ..pool import POOL_KIND, Key, PoolStatistics
from ..pool._deaths import live_lives
from ..pool._layout import MAGIC
from ..pool._stats import inspect
from ._lock_commands import KNOWN_KINDS, fleet_name, kind_number


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``orbit pool`` to ``orbit``."""
    cmd = subparsers.add_parser("pool", help="show a fleet's resource pool table")
    cmd.add_argument("fleet", type=fleet_name, help="fleet name")
    cmd.add_argument(
        "--kind", type=kind_number, metavar="K", default=POOL_KIND,
        help=f"the pool's kind number (default {POOL_KIND})",
    )  # fmt: skip
    cmd.set_defaults(func=cmd_pool)


def cmd_pool(args: argparse.Namespace) -> int:
    """Attach read-only (no node, no lock held for long) and print the table."""
    name = object_name(args.fleet, args.kind)
    size = object_size(name)
    if size is not None and read_prefix(name, min(size, len(MAGIC))) != MAGIC:
        held = KNOWN_KINDS.get(args.kind, "an object of another kind")
        print(f"fleet {args.fleet!r} kind {args.kind} holds a {held}, not a pool table")
        return 1
    statistics = inspect(args.fleet, args.kind)
    if statistics is None:
        print(f"fleet {args.fleet!r} has no pool table of kind {args.kind}")
        return 1
    observer = Fleet.observe(args.fleet, statistics.fleet_capacity)
    print("\n".join(format_statistics(statistics, live_lives(statistics, observer))))
    return 0


def _life(life: tuple[int, int], alive: set[tuple[int, int]]) -> str:
    return "alive" if life in alive else "dead"


def _dead_by_key(stats: PoolStatistics, alive: set[tuple[int, int]]) -> dict[Key, tuple[int, int]]:
    """Per key, (resources, idle units) whose owner life is over: its node is free, or
    another life holds it. Such resources count as dead, not live, until reported."""
    dead: dict[Key, tuple[int, int]] = {}
    for res in stats.resources:
        if (res.owner_node, res.owner_incarnation) in alive:
            continue
        count, idle = dead.get(res.key, (0, 0))
        free = max(0, res.capacity - res.reserved - res.active) if res.state == "live" else 0
        dead[res.key] = (count + (res.state == "live"), idle + free)
    return dead


def format_statistics(stats: PoolStatistics, alive: set[tuple[int, int]]) -> list[str]:
    """The lines ``orbit pool`` prints for one snapshot; ``alive``: the (node, incarnation)
    lives that are not over (``live_lives``).

    A resource whose owner node is dead stays in the table until its death is
    reported (``Pool.node_dead``, ``watch_deaths`` or a client pool's upkeep); the
    OWNER column says so, and the keys table counts it under DEAD, not LIVE.
    Per key, as PgBouncer's ``SHOW POOLS``: LIVE, IDLE and IN USE resources of
    live owners, WAITING client-pool callers, CREATING claims, DEAD resources.
    """
    members = stats.members
    lines = [
        f"pool of fleet {stats.fleet!r}, kind {stats.kind}, epoch {stats.epoch}",
        f"  geometry    {stats.fleet_capacity} nodes x {stats.lane_capacity} resources, "
        f"{stats.key_capacity} keys",
        f"  totals      {stats.live_count} live, {stats.draining_count} draining, "
        f"{stats.reserved_count} reserved, {stats.active_count} active, "
        f"{stats.creating_count} creating, {stats.waiting_nodes_count} waiting",
        "  members     "
        + (
            ", ".join(f"node {n} (incarnation {i}, {_life((n, i), alive)})" for n, i in members)
            or "none"
        ),
        "",
        f"keys ({stats.keys_count})",
        f"  {'KEY':<32}  {'LIVE':>4}  {'IDLE':>4}  {'IN USE':>6}  {'WAITING':>7}  "
        f"{'CREATING':>8}  {'DEAD':>4}  {'VERSION':>10}  CLAIMS",
    ]
    dead = _dead_by_key(stats, alive)
    for key in stats.keys:
        claims = ", ".join(f"node {node}: {count}" for node, count in key.claims) or "-"
        gone, gone_idle = dead.get(key.key, (0, 0))
        live, idle = key.live - gone, key.idle - gone_idle
        lines.append(
            f"  {key.key!s:<32}  {live:>4}  {idle:>4}  {live - idle:>6}  {key.waiting:>7}  "
            f"{key.creating:>8}  {gone:>4}  {key.version:>10}  {claims}"
        )
    lines += [
        "",
        f"resources ({len(stats.resources)})",
        f"  {'ID':<14}  {'KEY':<32}  {'OWNER':<11}  {'INCARNATION':>20}  {'STATE':<8}  "
        f"{'CAP':>4}  {'RES':>4}  {'ACT':>4}  {'FENCE':>8}",
    ]
    for res in stats.resources:
        owner = f"{res.owner_node} {_life((res.owner_node, res.owner_incarnation), alive)}"
        lines.append(
            f"  {res.id!s:<14}  {res.key!s:<32}  {owner:<11}  "
            f"{res.owner_incarnation:>20}  {res.state:<8}  {res.capacity:>4}  "
            f"{res.reserved:>4}  {res.active:>4}  {res.fence:>8}"
        )
    return lines
