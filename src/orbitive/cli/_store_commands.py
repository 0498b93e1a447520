"""``orbit locks | inspect | force-release`` on a named-lock store, any engine.

The store is the one :func:`~orbitive.store.open_store` opens for ``--store URL``
(no URL: the embedded SQLite file). An ``shm://`` URL joins its fleet as one node
for the command's duration; ``orbit locks FLEET`` reads the same leases without
joining. ``orbit locks`` also shows each semaphore that has holders, with each
holder's slot, owner, token and seconds left.
"""

from __future__ import annotations

import argparse
import json
from itertools import groupby

from ..store import LockInfo, SlotInfo, open_store


class UsageError(Exception):
    """Arguments argparse accepted that do not make a command (exit status 2)."""


class NothingFound(Exception):
    """Nothing to show or remove: the fleet, table or budget named is not there (exit
    status 1). ``orbit`` prints the message as its other errors, ``orbit COMMAND: ...``."""


def add_store_option(parser: argparse.ArgumentParser) -> None:
    """``--store URL``, the same on every command that opens a store."""
    parser.add_argument(
        "--store",
        default=None,
        metavar="URL",
        help="store URL: sqlite:///path, postgresql://..., redis://..., shm://FLEET "
        "(default: the SQLite file in the user's state directory, as open_store() picks it)",
    )


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """``--json``: print one JSON object instead of the table."""
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def print_json(value: object) -> None:
    """``value`` as indented JSON on stdout."""
    print(json.dumps(value, indent=2))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``orbit inspect`` to ``orbit`` (``locks`` and ``force-release`` live in ``_lock``)."""
    cmd = subparsers.add_parser(
        "inspect",
        help="show who holds a store lock",
        description="Print the holder of the store lock NAME; exit 1 when nobody holds it.",
    )
    cmd.add_argument("name", metavar="NAME", help="the lock name")
    add_store_option(cmd)
    cmd.set_defaults(func=cmd_inspect)


_HEADER = f"{'name':<32} {'owner':<40} {'token':>8} {'left s':>10}"


def _line(info: LockInfo) -> str:
    return (
        f"{_printable(info.name):<32} {_printable(info.owner):<40} "
        f"{info.fencing_token:>8} {info.remaining_s:>10.3f}"
    )


def _printable(text: str) -> str:
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


_SLOT_HEADER = f"  {'slot':>4} {'owner':<40} {'token':>8} {'left s':>10}"


def _slot_line(info: SlotInfo) -> str:
    return (
        f"  {info.slot:>4} {_printable(info.owner):<40} "
        f"{info.fencing_token:>8} {info.remaining_s:>10.3f}"
    )


def store_locks(url: str | None, *, as_json: bool = False) -> int:
    """``orbit locks [--store URL]``: every live lock of the store by name, then every
    semaphore with holders, its holders by slot.

    With ``as_json``: ``{"store": URL, "locks": [{"name", "owner", "fencing_token",
    "expires_at", "remaining_s"}], "semaphores": [{"name", "slot", "limit", "owner",
    "fencing_token", "expires_at", "remaining_s"}]}`` (one entry per holder).
    """
    with open_store(url) as store:
        infos = store.locks()
        holders = store.semaphores()
        if as_json:
            print_json(
                {
                    "store": store.url,
                    "locks": [info._asdict() for info in infos],
                    "semaphores": [holder._asdict() for holder in holders],
                }
            )
            return 0
        print(_HEADER)
        for info in infos:
            print(_line(info))
        print(f"{len(infos)} live lock(s) in {store.url}")
        named = [(name, list(group)) for name, group in groupby(holders, lambda h: h.name)]
        for name, group in named:
            limit = max(holder.limit for holder in group)
            print(f"\nsemaphore {_printable(name)}: {len(group)} of {limit} slot(s) held")
            print(_SLOT_HEADER)
            for holder in group:
                print(_slot_line(holder))
        if named:
            print(f"{len(named)} semaphore(s) with holders in {store.url}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    """``orbit inspect [--store URL] NAME``: the holder, or exit 1 when not held."""
    with open_store(args.store) as store:
        info = store.inspect(args.name)
    if info is None:
        print("not held")
        return 1
    print(_HEADER)
    print(_line(info))
    return 0


def store_force_release(url: str | None, name: str) -> int:
    """``orbit force-release [--store URL] NAME``: exit 0 when released, 1 when not held."""
    with open_store(url) as store:
        released = store.force_release(name)
    print("released" if released else "not held")
    return 0 if released else 1
