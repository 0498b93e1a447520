"""``orbit list | clear | locks | watch | force-release``: fleet objects and keyed leases."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import selectors
import sys
import time
from collections.abc import Iterator

from .._core._errors import AccessDenied, FleetError, InvalidName, LayoutMismatch
from .._core._fleet import (
    check_fleet_name,
    hold_membership,
    let_go_membership,
    members_name,
    membership,
)
from .._core._region import (
    CREATING,
    SHM_DIR,
    fleet_entries,
    listed_memberships,
    listed_objects,
    object_name,
    object_size,
    unlink_object,
)
from ..lock import LockEvent, LockKey, LockTable
from ..lock._layout import DEFAULT_STATE_KIND, STORE_STATE_KIND
from ..lock._tables import open_tables
from ._store_commands import (
    NothingFound,
    UsageError,
    add_json_option,
    add_store_option,
    print_json,
    store_force_release,
    store_locks,
)

#: What the well-known kind numbers hold.
KNOWN_KINDS = {
    228: "lock state table",
    229: "lock transition ring",
    230: "store lock state table",
    231: "store lock transition ring",
    247: "resource pool",
    248: "budget board",
    249: "rate-limit table",
}
#: What each lock table of a fleet is, by its state kind (``orbit locks FLEET``).
TABLE_ROLES = {
    DEFAULT_STATE_KIND: "LockTable",
    STORE_STATE_KIND: "shm:// store",
}
KIND_HELP = (
    "kind number 0..255 (228/229 lock table, 230/231 store lock table, 247 resource pool, "
    "249 rate-limit table)"
)
#: Longest wait of ``orbit watch`` between checks of its deadline, in seconds.
_WATCH_STEP_S = 60.0
#: Largest ``orbit watch --seconds`` (about 11.6 days); longer: leave it out.
WATCH_SECONDS_MAX = 1e6


def kind_text(kind: int) -> str:
    """A kind for people: what it holds, the number in parentheses ("kind 17" when unknown)."""
    what = KNOWN_KINDS.get(kind)
    return f"kind {kind}" if what is None else f"{what} (kind {kind})"


def kind_number(text: str) -> int:
    """argparse type for an SHM kind number."""
    if not text.isdecimal() or not 0 <= int(text) <= 255:
        raise argparse.ArgumentTypeError(f"{KIND_HELP}; got {text!r}")
    return int(text)


def fleet_name(text: str) -> str:
    """argparse type for a fleet name, with the library's own message."""
    try:
        return check_fleet_name(text)
    except InvalidName as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _fleet_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("fleet", type=fleet_name, help="fleet name")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the fleet and lock commands to ``orbit``."""
    cmd = subparsers.add_parser("list", help="list a fleet's SHM objects, or every fleet")
    cmd.add_argument(
        "fleet", nargs="?", type=fleet_name, help="fleet name (default: list every fleet)"
    )
    cmd.add_argument("--kind", type=kind_number, metavar="K", help=f"only this {KIND_HELP}")
    add_json_option(cmd)
    cmd.set_defaults(func=cmd_list)

    cmd = subparsers.add_parser(
        "clear",
        help="unlink a stopped fleet's SHM objects",
        description=(
            "Remove fleet FLEET's names from /dev/shm: the objects of kind K (--kind), or "
            "(--all --yes) every object, the membership object (which records the capacity), "
            "the client pool and readiness sockets and what dead creators left; "
            "'orbit list FLEET' shows them. Refused while a member of the fleet lives. "
            "This ends every lease and restarts the fencing tokens at 1. Exit 1 when there "
            "is nothing to remove."
        ),
    )
    _fleet_arg(cmd)
    which = cmd.add_mutually_exclusive_group(required=True)
    which.add_argument("--kind", type=kind_number, metavar="K", help=f"only this {KIND_HELP}")
    which.add_argument(
        "--all", action="store_true", help="every kind, the membership object and sockets"
    )
    cmd.add_argument("--yes", action="store_true", help="confirm --all")
    cmd.set_defaults(func=cmd_clear)

    cmd = subparsers.add_parser(
        "locks",
        help="show the live leases of a fleet's lock tables, or the live locks of a store",
        description=(
            "With FLEET: every live lease in the fleet's lock tables (its LockTable and its "
            "shm:// store table), read without joining the fleet. Without FLEET: the live "
            "locks of the store at --store URL (default: the SQLite file open_store() "
            "uses)."
        ),
    )
    cmd.add_argument("fleet", nargs="?", type=fleet_name, help="fleet name")
    add_store_option(cmd)
    add_json_option(cmd)
    cmd.set_defaults(func=cmd_locks)

    cmd = subparsers.add_parser("watch", help="print lock transitions as they happen")
    _fleet_arg(cmd)
    cmd.add_argument(
        "--seconds",
        type=watch_seconds,
        default=None,
        metavar="S",
        help=f"stop after S seconds, 0 < S <= {WATCH_SECONDS_MAX:g} (default: until interrupted)",
    )
    cmd.set_defaults(func=cmd_watch)

    cmd = subparsers.add_parser(
        "force-release",
        help="release a lock whoever holds it",
        usage="orbit force-release [-h] ([--store URL] NAME | FLEET NAMESPACE LABEL)",
        description=(
            "NAME: release the store lock NAME (at --store URL, default: the SQLite file "
            "open_store() uses). FLEET NAMESPACE LABEL: release that key in the fleet's "
            "lock tables. Exit 0 when something live was released, 1 when it was not held."
        ),
    )
    cmd.add_argument("target", nargs="+", metavar="NAME", help="NAME, or FLEET NAMESPACE LABEL")
    add_store_option(cmd)
    cmd.set_defaults(func=cmd_force_release)


def watch_seconds(text: str) -> float:
    """argparse type for ``--seconds``: seconds in (0, :data:`WATCH_SECONDS_MAX`]."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value <= WATCH_SECONDS_MAX:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds in (0, {WATCH_SECONDS_MAX:g}], got {text!r} "
            "(leave --seconds out to watch until interrupted)"
        )
    return value


def _kinds(args: argparse.Namespace) -> range | list[int]:
    return range(256) if args.kind is None else [args.kind]


#: One name of a fleet: its kind (a number, or ``members``), bytes (None: gone), the
#: name, and what it holds.
Row = tuple[int | str, int | None, str, str]


def cmd_list(args: argparse.Namespace) -> int:
    """Print every name of the fleet that ``orbit clear`` would remove.

    The objects of each kind are probed by their exact names (no globbing); then
    come client and readiness sockets and dead creations' temporary names, and (without
    ``--kind``) the membership object, with the capacity and the nodes held.
    With ``--json``: ``{"fleets": [{"fleet", "objects": [{"kind", "bytes", "name",
    "holds"}]}]}`` (``kind`` a number, or ``"members"``; ``bytes`` null for a name
    gone meanwhile), empty lists (and exit 1) when nothing exists.
    """
    if args.fleet is None:
        return _list_fleets(args.json)
    rows: list[Row] = []
    for kind in _kinds(args):
        name = object_name(args.fleet, kind)
        size = object_size(name)
        if size is not None:
            rows.append((kind, size, name, KNOWN_KINDS.get(kind, "")))
    shown = {object_name(args.fleet, kind) for kind in _kinds(args)}
    for name in fleet_entries(args.fleet, _kinds(args), members=args.kind is None):
        if name not in shown:
            rows.append(_entry_row(args.fleet, name))
    if args.json:
        print_json({"fleets": [_fleet_json(args.fleet, rows)] if rows else []})
        return 0 if rows else 1
    if not rows:
        raise NothingFound(_nothing_text(args))
    for row in rows:
        print(_row_text(row))
    return 0


def _row_text(row: Row) -> str:
    kind, size, name, what = row
    bytes_text = "gone" if size is None else f"{size:,} bytes"
    return f"{kind!s:>7}  {bytes_text:>18}  {name}  {what}".rstrip()


def _fleet_json(fleet: str, rows: list[Row]) -> dict[str, object]:
    return {
        "fleet": fleet,
        "objects": [
            {"kind": kind, "bytes": size, "name": name, "holds": what or None}
            for kind, size, name, what in rows
        ],
    }


#: The end of a readiness socket's name (``_channel.Channel.path``): word, node, bit.
_WATCH = re.compile(r"\.w\d+\.n(\d+)\.b\d+$")


def _entry_row(fleet: str, name: str) -> Row:
    """The row of a name that is not a kind's object: a socket, a temporary name, the
    membership object."""
    kind_text = name[len(f"orbit-{fleet}-") :].partition("-")[0]
    kind: int | str = int(kind_text) if kind_text.isdecimal() else kind_text
    try:
        size: int | None = os.lstat(SHM_DIR / name).st_size
    except FileNotFoundError:
        size = None
    if CREATING in name:
        what = "left by a creation whose process died"
    elif name.endswith(".sock"):
        role, _, rest = name[len(f"orbit-{fleet}-{kind_text}-") :].partition("-")
        owner = "transaction mode" if role == "txn" else "client pool"
        what = f"{owner} socket of node " + rest.partition("-")[0]
    elif (watch := _WATCH.search(name)) is not None:
        what = f"readiness socket of node {watch[1]}"
    else:
        what = _membership_text(fleet)
    return kind, size, name, what


def _membership_text(fleet: str) -> str:
    try:
        found = membership(fleet)
    except LayoutMismatch as error:
        return f"membership object: {error.message}"
    if found is None:
        return "membership object"
    held = ", ".join(map(str, found.held)) or "none"
    return f"membership object: capacity {found.capacity}, nodes held: {held}"


def _list_fleets(as_json: bool) -> int:
    """One line per fleet of this user that has SHM objects: its kinds and bytes."""
    fleets: dict[str, list[Row]] = {}
    for fleet, kind, size in listed_objects():
        fleets.setdefault(fleet, []).append((kind, size, object_name(fleet, kind), ""))
    for fleet, size in listed_memberships():
        row: Row = ("members", size, members_name(fleet), "membership object")
        fleets.setdefault(fleet, []).append(row)
    if as_json:
        listing = [_fleet_json(fleet, rows) for fleet, rows in sorted(fleets.items())]
        print_json({"fleets": listing})
        return 0 if fleets else 1
    if not fleets:
        raise NothingFound("no fleets with SHM objects")
    for fleet, rows in sorted(fleets.items()):
        kinds = ", ".join(str(row[0]) for row in rows)
        print(f"{fleet}  kinds {kinds}  {sum(row[1] or 0 for row in rows):,} bytes")
    return 0


def cmd_clear(args: argparse.Namespace) -> int:
    """Unlink objects only while no member holds the fleet's membership object.

    The fleet's objects, client and readiness sockets and dead creations' temporary
    names go;
    a name another user planted under our pattern stays, named on stderr, and
    the status is then 1.
    """
    if args.all and not args.yes:
        raise UsageError(
            f"--all removes every object of fleet {args.fleet!r} and ends its leases: "
            f"run 'orbit clear {args.fleet} --all --yes'"
        )
    if not fleet_entries(args.fleet, _kinds(args), members=args.all):
        raise NothingFound(_nothing_text(args))
    removed, refused = 0, 0
    with _exclusive_membership(args.fleet):
        for name in fleet_entries(args.fleet, _kinds(args), members=args.all):
            try:
                removed += unlink_object(name)
            except AccessDenied as error:
                print(f"orbit clear: {error}", file=sys.stderr)
                refused += 1
    print(f"removed {removed} object(s) of fleet {args.fleet!r}")
    return 1 if refused else 0


def _nothing_text(args: argparse.Namespace) -> str:
    """``orbit list`` or ``clear`` found no name of the fleet (of the kind asked)."""
    if args.kind is None:
        return f"fleet {args.fleet!r} has no SHM objects ('orbit list' shows every fleet)"
    return (
        f"fleet {args.fleet!r} has no {kind_text(args.kind)} "
        f"('orbit list {args.fleet}' shows its objects)"
    )


@contextlib.contextmanager
def _exclusive_membership(fleet: str) -> Iterator[None]:
    """Hold the membership object exclusively: no member is alive, from any environment.

    A fleet with no membership object gets a placeholder for the while (see
    ``hold_membership``), removed again before the hold ends.

    Raises:
        FleetError: a member is alive.
    """
    fd, placeholder = hold_membership(fleet)
    try:
        yield
    finally:
        let_go_membership(fleet, fd, placeholder)


def clear_stopped_fleet(fleet: str) -> bool:
    """Remove every name of ``fleet``, as ``orbit clear FLEET --all --yes`` does, once no
    member lives (``orbit demo``'s own fleets, whatever ended the demo).

    Returns:
        True when cleared; False when a member is still alive (nothing touched).

    Raises:
        AccessDenied: a name under our pattern is another user's (the others are gone).
    """
    try:
        with _exclusive_membership(fleet):
            for name in fleet_entries(fleet, range(256), members=True):
                unlink_object(name)
    except FleetError:
        return False
    return True


def printable(raw: bytes) -> str:
    """``raw`` as text for a terminal: UTF-8 with control characters escaped."""
    text = raw.decode(errors="backslashreplace")
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _key_text(key: LockKey) -> tuple[str, str]:
    return printable(key.namespace), printable(key.label)


def cmd_locks(args: argparse.Namespace) -> int:
    """Print every live lease of a fleet, or every live lock of a store."""
    if args.fleet is None:
        return store_locks(args.store, as_json=args.json)
    if args.store is not None:
        raise UsageError("give FLEET or --store URL, not both")
    with open_tables(args.fleet, observe=True) as tables:
        if not tables:
            raise _no_table(args.fleet)
        if args.json:
            print_json({"fleet": args.fleet, "tables": [_table_json(t) for t in tables]})
            return 0
        print(_LEASE_HEADER)
        for table in tables:
            _print_leases(table)
        for table in tables:
            _print_summary(table)
    return 0


def _table_json(table: LockTable) -> dict[str, object]:
    """One lock table for ``orbit locks FLEET --json``: its counters and live leases.

    ``acquisitions`` is the last fencing token (each acquisition takes the next);
    ``conflicts`` the ``try_acquire`` calls that found a live holder;
    ``recoveries`` the section's stripe mutexes repaired after a holder died.
    """
    stats = table.statistics()
    leases = []
    for lease in table.leases():
        namespace, label = _key_text(lease.key)
        leases.append(
            {
                "namespace": namespace,
                "label": label,
                "owner": lease.owner.text(),
                "fencing_token": lease.fencing_token,
                "remaining_s": lease.remaining(),
                "state_revision": lease.state_revision,
            }
        )
    return {
        "state_kind": table.layout.state_kind,
        "event_kind": table.layout.event_kind,
        "capacity": stats.capacity,
        "live": stats.occupied_count,
        "tombstones": stats.tombstone_count,
        "max_probe": stats.max_probe,
        "acquisitions": stats.last_fencing_token,
        "conflicts": stats.conflicts_count,
        "recoveries": stats.recoveries_count,
        "last_state_revision": stats.last_state_revision,
        "leases": leases,
    }


_LEASE_HEADER = (
    f"{'namespace':<24} {'label':<24} {'owner':<34} {'token':>8} {'left s':>8} {'rev':>8}"
)


def _no_table(fleet: str) -> NothingFound:
    return NothingFound(
        f"fleet {fleet!r} has no lock table ('orbit list {fleet}' shows its objects, "
        "'orbit list' every fleet)"
    )


def _print_leases(table: LockTable) -> None:
    for lease in table.leases():
        namespace, label = _key_text(lease.key)
        print(
            f"{namespace:<24} {label:<24} {lease.owner.text():<34} "
            f"{lease.fencing_token:>8} {lease.remaining():>8.3f} {lease.state_revision:>8}"
        )


def _print_summary(table: LockTable) -> None:
    """One line per table, led by what the table is: ``LockTable (kinds 228/229): ...``
    or ``shm:// store (kinds 230/231): ...``."""
    stats = table.statistics()
    layout = table.layout
    role = TABLE_ROLES[layout.state_kind]
    print(
        f"{role} (kinds {layout.state_kind}/{layout.event_kind}): "
        f"{stats.occupied_count} live of {stats.capacity} slots, "
        f"{stats.tombstone_count} tombstones, probe bound {stats.max_probe}, "
        f"last token {stats.last_fencing_token} (the acquisitions), "
        f"{stats.conflicts_count} conflicts, {stats.recoveries_count} recoveries, "
        f"revision {stats.last_state_revision}"
    )


def _event_line(event: LockEvent) -> str:
    namespace, label = _key_text(event.key)
    left = "" if event.expires_at is None else f" left={event.expires_at - time.monotonic():.3f}s"
    return (
        f"rev={event.state_revision} {event.transition:<8} {namespace}/{label} "
        f"owner={event.owner.text()} token={event.fencing_token} node={event.node}{left}"
    )


def cmd_watch(args: argparse.Namespace) -> int:
    """Print transitions through the readiness descriptors until interrupted or timed out."""
    with open_tables(args.fleet, observe=False) as tables:
        if not tables:
            raise _no_table(args.fleet)
        deadline = None if args.seconds is None else time.monotonic() + args.seconds
        with selectors.DefaultSelector() as selector:
            for table in tables:
                selector.register(table.fileno(), selectors.EVENT_READ, table)
            while deadline is None or time.monotonic() < deadline:
                left = _WATCH_STEP_S if deadline is None else deadline - time.monotonic()
                for ready, _ in selector.select(min(max(left, 0.0), _WATCH_STEP_S)):
                    ready.data.drain()
                for table in tables:
                    _print_poll(table)
    return 0


def _print_poll(table: LockTable) -> None:
    result = table.poll()
    for event in result.events:
        print(_event_line(event), flush=True)
    if result.lost:
        print(
            f"lost: overwritten={result.overwritten} unavailable={result.unavailable} "
            f"malformed={result.malformed}",
            flush=True,
        )


def cmd_force_release(args: argparse.Namespace) -> int:
    """Release one lock whoever holds it; exit 1 when nothing live was there."""
    if len(args.target) == 1:
        return store_force_release(args.store, args.target[0])
    if len(args.target) != 3 or args.store is not None:
        raise UsageError("give [--store URL] NAME, or FLEET NAMESPACE LABEL")
    fleet, namespace, label = args.target
    check_fleet_name(fleet)
    with open_tables(fleet, observe=False) as tables:
        if not tables:
            raise _no_table(fleet)
        key = LockKey(namespace, label)
        released = [table.force_release(key) for table in tables]
    print("released" if any(released) else "not held")
    return 0 if any(released) else 1
