"""``orbit budget URL NAME``: the hosts of a connection budget, as its coordinator holds them.

Two statements on the coordinator (its units and the hosts' posts), nothing
written. Per host: the units it holds, its clients in use and idle, its callers
waiting and the units it still needs (as it last posted them, at most
``handover_within / 4`` old), its ``max_live``, and the seconds left on its
units' leases (the soonest and the latest) on the coordinator's clock.
"""

from __future__ import annotations

import argparse

from ..clients._coordinator import Post, Survey, read_survey
from ._store_commands import _printable


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
    cmd.set_defaults(func=cmd_budget)


def cmd_budget(args: argparse.Namespace) -> int:
    """Read the budget's units and posts once and print them."""
    survey = read_survey(args.url, args.name)
    if not survey.units and not survey.posts:
        print(f"no host holds units of budget {_printable(args.name)!r}")
        return 1
    print("\n".join(format_survey(args.name, survey)))
    return 0


def format_survey(name: str, survey: Survey) -> list[str]:
    """The lines ``orbit budget`` prints for one survey of the budget ``name``."""
    posts = {post.host: post for post in survey.latest()}
    owners = {unit.owner for unit in survey.units}
    totals = {unit.limit for unit in survey.units} | {post.total for post in posts.values()}
    total = "/".join(str(value) for value in sorted(totals))
    waiting = sum(post.waiting for post in posts.values())
    lines = [
        f"budget {_printable(name)!r}: total {total}, {len(survey.units)} units held by "
        f"{len(owners)} hosts, {waiting} callers waiting",
        "",
        f"  {'HOST':<40}  {'UNITS':>5}  {'IN USE':>6}  {'IDLE':>4}  {'WAITING':>7}  "
        f"{'NEED':>4}  {'MAX LIVE':>8}  {'LEASES LEFT S':>13}",
    ]
    for host in sorted(owners | set(posts)):
        held = [unit.remaining_s for unit in survey.held_by(host)]
        left = f"{min(held):.1f}..{max(held):.1f}" if held else "-"
        post = posts.get(host)
        numbers = _posted(post)
        lines.append(f"  {_printable(host):<40}  {len(held):>5}  {numbers}  {left:>13}")
    return lines


def _posted(post: Post | None) -> str:
    if post is None:  # units without a post: the post lapsed or is being replaced
        return f"{'-':>6}  {'-':>4}  {'-':>7}  {'-':>4}  {'-':>8}"
    return (
        f"{post.in_use:>6}  {post.idle:>4}  {post.waiting:>7}  {post.need:>4}  {post.max_live:>8}"
    )
