"""``orbit tasks``: the run-once Celery tasks (``orbitive.celery``) that hold keys in a store.

Read from the store's live locks by name alone, so the command needs no Celery:
``orbitive.celery`` names a key's run lock ``<prefix>/<task>/<digest>``, its queue
marker ``.../queued`` and its cool-down ``.../cooldown``, with the task id as the
owner's first word (a running task's owner goes on with ``host:pid:random``).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import NamedTuple

from ..store import LockInfo, open_store
from ._store_commands import _printable, add_json_option, add_store_option, print_json

#: The states of a key, by the suffix of its lock name.
_STATES = (("/queued", "queued"), ("/cooldown", "cooling"))


class TaskKey(NamedTuple):
    """One held key of a run-once task.

    Attributes:
        task: the task's name (or the hash orbitive.celery put in its place).
        key: the key's digest.
        state: ``"running"``, ``"queued"`` or ``"cooling"``.
        task_id: the id of the task that holds the key.
        process: ``"host:pid:random"`` of the process running it ("" unless running).
        fencing_token: the lock's fencing token.
        remaining_s: seconds left of its lease.
        name: the lock's name in the store.
    """

    task: str
    key: str
    state: str
    task_id: str
    process: str
    fencing_token: int
    remaining_s: float
    name: str


def task_keys(infos: Iterable[LockInfo], prefix: str = "celery") -> list[TaskKey]:
    """The held keys among the store's live locks ``infos``, in their order.

    Args:
        infos: live locks, as ``Store.locks()`` returns them.
        prefix: the tasks' ``lock_prefix`` (a ``str``).

    Returns:
        A :class:`TaskKey` for each lock whose name has the shape orbitive.celery
        gives; other locks are left out.
    """
    found = []
    for info in infos:
        if not info.name.startswith(f"{prefix}/"):
            continue
        rest, state = info.name[len(prefix) + 1 :], "running"
        for suffix, named in _STATES:
            if rest.endswith(suffix):
                rest, state = rest.removesuffix(suffix), named
        task, slash, key = rest.rpartition("/")
        if not slash or not task or not key:
            continue
        task_id, _, process = info.owner.partition(" ")
        found.append(
            TaskKey(
                task, key, state, task_id, process, info.fencing_token, info.remaining_s, info.name
            )
        )
    return found


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``orbit tasks`` to ``orbit``."""
    cmd = subparsers.add_parser(
        "tasks",
        help="show the run-once Celery tasks (orbitive.celery) holding keys in a store",
        description="Every key of an orbitive.celery Singleton task held in the store: its "
        "task, key digest, state (running, queued, cooling), task id, process, fencing token "
        "and seconds left.",
    )
    add_store_option(cmd)
    cmd.add_argument(
        "--prefix",
        default="celery",
        help="the tasks' lock_prefix (default: celery)",
    )
    add_json_option(cmd)
    cmd.set_defaults(func=cmd_tasks)


_HEADER = (
    f"{'task':<32} {'key':<12} {'state':<8} {'task id':<36} {'process':<28} "
    f"{'token':>8} {'left s':>10}"
)


def cmd_tasks(args: argparse.Namespace) -> int:
    """``orbit tasks [--store URL] [--prefix P] [--json]``: exit 0.

    With ``--json``: ``{"store": URL, "tasks": [{"task", "key", "state", "task_id",
    "process", "fencing_token", "remaining_s", "name"}]}``.
    """
    with open_store(args.store) as store:
        keys = task_keys(store.locks(), args.prefix)
        url = store.url
    if args.json:
        print_json({"store": url, "tasks": [key._asdict() for key in keys]})
        return 0
    print(_HEADER)
    for key in keys:
        print(
            f"{_printable(key.task):<32} {key.key[:12]:<12} {key.state:<8} "
            f"{_printable(key.task_id):<36} {_printable(key.process):<28} "
            f"{key.fencing_token:>8} {key.remaining_s:>10.3f}"
        )
    print(f"{len(keys)} task key(s) held in {url}")
    return 0
