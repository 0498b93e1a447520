"""``orbit budget URL NAME``: the hosts of a connection budget, as its coordinator holds them.

Two statements on the coordinator (its units and the hosts' posts), nothing
written. Per host: the units it holds, its clients in use and idle, its callers
waiting and the units it still needs (as it last posted them, at most
``handover_within / 4`` old), its ``max_live``, and the seconds left on its
units' leases (the soonest and the latest) on the coordinator's clock. A host
holding units without a post (its post lapsed or is being replaced) shows
only its units.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..clients._coordinator import Survey, read_survey
from ._store_commands import NothingFound, _printable, add_json_option, print_json

#: A post's numbers, in the order of the table's columns.
_POSTED = ("in_use", "idle", "waiting", "need", "max_live")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``orbit budget`` to ``orbit``."""
    cmd = subparsers.add_parser(
        "budget",
        help="show the hosts of a connection budget",
        description="Print the hosts holding units of the budget NAME at the coordinator "
        "URL, with their units, clients, waiters and lease deadlines; exit 1 when no "
        "host holds or posts any.",
    )
    cmd.add_argument("url", metavar="URL", help="the coordinator: postgresql://... or redis://...")
    cmd.add_argument("name", metavar="NAME", help="the budget's name")
    add_json_option(cmd)
    cmd.set_defaults(func=cmd_budget)


def cmd_budget(args: argparse.Namespace) -> int:
    """Read the budget's units and posts once and print them."""
    survey = read_survey(args.url, args.name)
    if not survey.units and not survey.posts:
        raise NothingFound(f"no host holds units of budget {_printable(args.name)!r}")
    if args.json:
        print_json(as_json(args.name, survey))
    else:
        print("\n".join(format_survey(args.name, survey)))
    return 0


def hosts(survey: Survey) -> list[dict[str, Any]]:
    """Per host, sorted: ``host``, ``units``, ``leases_left_s`` (each unit's seconds left,
    soonest first) and, if it has a post, its numbers (``in_use``, ``idle``,
    ``waiting``, ``need``, ``max_live``)."""
    posts = {post.host: post for post in survey.latest()}
    found = []
    for host in sorted({unit.owner for unit in survey.units} | set(posts)):
        left = sorted(unit.remaining_s for unit in survey.held_by(host))
        row: dict[str, Any] = {"host": host, "units": len(left), "leases_left_s": left}
        post = posts.get(host)
        if post is not None:
            row.update({field: getattr(post, field) for field in _POSTED})
        found.append(row)
    return found


def _totals(survey: Survey) -> list[int]:
    return sorted({unit.limit for unit in survey.units} | {p.total for p in survey.latest()})


def as_json(name: str, survey: Survey) -> dict[str, Any]:
    """``orbit budget --json``: ``{"budget", "totals", "units", "hosts": [...]}``; the
    hosts as :func:`hosts` gives them (more than one total: hosts disagree)."""
    return {
        "budget": name,
        "totals": _totals(survey),
        "units": len(survey.units),
        "hosts": hosts(survey),
    }


def format_survey(name: str, survey: Survey) -> list[str]:
    """The lines ``orbit budget`` prints for one survey of the budget ``name``."""
    rows = hosts(survey)
    total = "/".join(str(value) for value in _totals(survey))
    waiting = sum(row.get("waiting", 0) for row in rows)
    holding = sum(1 for row in rows if row["units"])
    lines = [
        f"budget {_printable(name)!r}: total {total}, {len(survey.units)} units held by "
        f"{holding} hosts, {waiting} callers waiting",
        "",
        f"  {'HOST':<40}  {'UNITS':>5}  {'IN USE':>6}  {'IDLE':>4}  {'WAITING':>7}  "
        f"{'NEED':>4}  {'MAX LIVE':>8}  {'LEASES LEFT S':>13}",
    ]
    for row in rows:
        left = row["leases_left_s"]
        span = f"{left[0]:.1f}..{left[-1]:.1f}" if left else "-"
        posted = [str(row.get(field, "-")) for field in _POSTED]
        lines.append(
            f"  {_printable(row['host']):<40}  {row['units']:>5}  {posted[0]:>6}  "
            f"{posted[1]:>4}  {posted[2]:>7}  {posted[3]:>4}  {posted[4]:>8}  {span:>13}"
        )
    return lines
