"""What child processes run in the cross-process tests, and the test's handle on them.

This module imports no test framework, so a spawned child starts quickly. Most
children run :func:`serve`: they join the fleet, open its lock table and then
call table or fleet methods on request, sending results (or the OrbitError
raised) back through the channel. The others reproduce one scenario each.
"""

from __future__ import annotations

import gc
import json
import mmap
import os
import random
import signal
import struct
import sys
import threading
import time
from multiprocessing.synchronize import Barrier
from typing import Any

from orbitive import Fleet, OrbitError
from orbitive.lock import (
    Acquired,
    LockKey,
    LockLayout,
    LockLease,
    LockOwner,
    LockTable,
    _key_wait,
    _steps,
)
from orbitive.lock._ring import Ring, RingGeometry
from orbitive.pool import Key, Pool

from ._processes import Channel, Child, Processes
from ._ptrace import trace_me

#: The key the race and crash scenarios fight over.
KEY = LockKey("tests.children", "contended")
#: The namespace of the keys a renewing holder is killed with (``renew_stopping_at``).
RENEWED_NAMESPACE = "tests.renewed"
#: A second key, for what a child does on its own.
OTHER_KEY = LockKey("tests.children", "other")
#: How many keys :func:`race_many` fights over, in how many rounds.
RACE_KEYS = 200
RACE_ROUNDS = 4


# -- a table server ---------------------------------------------------------------------


def serve(
    channel: Channel, name: str, capacity: int, node: int | None, layout: LockLayout | None
) -> None:
    """Join fleet ``name``, open its lock table, then answer requests until told to stop.

    Sends ``("ready", node, incarnation)`` or ``("refused", error)`` first. A
    request is ``(target, method, args)`` with target "table" or "fleet"; the
    answer is ``("ok", result)`` or ``("raised", error)``. None stops it.
    """
    try:
        fleet = Fleet.join(name, capacity, node)
    except OrbitError as error:
        channel.send(("refused", error))
        return
    table = LockTable(fleet, layout)
    channel.send(("ready", fleet.node, fleet.incarnation))
    while (request := channel.recv(timeout=None)) is not None:
        target, method, args = request
        try:
            result = getattr(fleet if target == "fleet" else table, method)(*args)
        except OrbitError as error:
            channel.send(("raised", error))
        else:
            channel.send(("ok", result))
    table.close()
    fleet.close()


class Server:
    """The test's handle on a child running :func:`serve`."""

    node: int
    incarnation: int

    def __init__(self, child: Child) -> None:
        self.child = child
        self.refused: OrbitError | None = None
        answer = child.recv()
        if answer[0] == "refused":
            self.refused = answer[1]
        else:
            _, self.node, self.incarnation = answer

    def table(self, method: str, *args: object) -> Any:
        """Call ``table.method(*args)`` in the child; re-raise what it raised."""
        return self._call("table", method, args)

    def fleet(self, method: str, *args: object) -> Any:
        """Call ``fleet.method(*args)`` in the child; re-raise what it raised."""
        return self._call("fleet", method, args)

    def _call(self, target: str, method: str, args: tuple[object, ...]) -> Any:
        self.child.send((target, method, args))
        status, result = self.child.recv()
        if status == "raised":
            raise result
        return result

    def stop(self) -> int:
        """Ask the child to close its table and fleet and exit; return its exit code."""
        self.child.send(None)
        return self.child.wait()


def start_server(
    processes: Processes,
    name: str,
    capacity: int,
    node: int | None = None,
    layout: LockLayout | None = None,
) -> Server:
    """Start a child running :func:`serve` and wait until it is ready (or refused)."""
    return Server(processes.start(serve, name, capacity, node, layout))


# -- scenarios --------------------------------------------------------------------------


def race(channel: Channel, name: str, capacity: int, barrier: Barrier, owner: bytes) -> None:
    """Open the table, wait at the barrier with the others, try KEY once, report."""
    table = LockTable(Fleet.join(name, capacity))
    table.current(KEY)  # map and warm up before the start line
    barrier.wait(timeout=60)
    result = table.try_acquire(KEY, LockOwner(owner), ttl=60.0)
    channel.send(("acquired" if isinstance(result, Acquired) else "occupied", result.lease))
    channel.recv()  # stay alive (holding the node) until the test has every answer


def race_many(
    channel: Channel, table: LockTable | None, name: str, barrier: Barrier, owner: bytes
) -> None:
    """Race for many keys with the others (see :func:`race_keys`); send the labels won.

    With ``table`` (fork only) the child uses its parent's table object;
    otherwise it joins fleet ``name`` (capacity 8) itself.
    """
    if table is None:
        table = LockTable(Fleet.join(name, 8))
    channel.send(race_keys(table, barrier, owner))


def race_keys(table: LockTable, barrier: Barrier, owner: bytes) -> list[bytes]:
    """Race RACE_ROUNDS times over RACE_KEYS keys; return every label won (round-prefixed).

    Each round starts at the barrier; a process tries each key once and then
    releases what it won, so the next round finds the table empty again.
    """
    won: list[bytes] = []
    try:
        for round_ in range(RACE_ROUNDS):
            won += race_round(table, barrier, owner, round_)
    except BaseException:
        barrier.abort()  # the others fail at once instead of waiting out the timeout
        raise
    return won


def race_round(table: LockTable, barrier: Barrier, owner: bytes, round_: int) -> list[bytes]:
    keys = [LockKey("tests.children.many", f"{round_}/{n}") for n in range(RACE_KEYS)]
    table.current(keys[0])
    barrier.wait(timeout=60)
    leases = []
    for key in keys:
        result = table.try_acquire(key, LockOwner(owner), 60.0)
        if isinstance(result, Acquired):
            leases.append(result.lease)
    barrier.wait(timeout=60)  # everybody has tried every key before anything is freed
    for lease in leases:
        assert table.release(lease), f"{lease.key} was released by someone else"
    return [lease.key.label for lease in leases]


def stop_in_critical_section(channel: Channel, name: str, capacity: int, operation: str) -> None:
    """Acquire KEY, stopping (SIGSTOP) after its slot went TOMBSTONE.

    Operation "raise-bound" stops after max_probe was raised for KEY instead, before
    its slot changed (the test makes KEY's home slot taken first). Sends
    ``"stopped"`` from inside the table's critical section; the test SIGKILLs it there.
    """
    stop_at = "bound_raised" if operation == "raise-bound" else "tombstoned"
    table = LockTable(Fleet.join(name, capacity))

    def hook(point: str) -> None:
        if point == stop_at:
            channel.send("stopped")
            os.kill(os.getpid(), signal.SIGSTOP)

    _steps.crash_hook = hook
    table.try_acquire(KEY, LockOwner(b"victim"), ttl=60.0)
    channel.send("finished")  # only reached if the test let it continue


def _renewed_holder(
    channel: Channel, name: str, capacity: int, label: str, ttl: float
) -> tuple[LockTable, LockLease]:
    """Take the key ``label`` of ``RENEWED_NAMESPACE`` for ``ttl`` seconds; send its lease."""
    table = LockTable(Fleet.join(name, capacity))
    result = table.try_acquire(LockKey(RENEWED_NAMESPACE, label), LockOwner(b"victim"), ttl)
    assert isinstance(result, Acquired)
    channel.send(result.lease)
    return table, result.lease


def renew_stopping_at(
    channel: Channel, name: str, capacity: int, label: str, ttl: float, point: str
) -> None:
    """Take a key and send its lease, then renew it on the Python steps, stopping (SIGSTOP)
    at the crash hook's ``point`` after sending ``"stopped"``; the test SIGKILLs it there."""
    table, lease = _renewed_holder(channel, name, capacity, label, ttl)

    def hook(reached: str) -> None:
        if reached == point:
            channel.send("stopped")
            os.kill(os.getpid(), signal.SIGSTOP)

    _steps.crash_hook = hook
    table.renew(lease, ttl)
    channel.send("finished")  # only reached if the point was never passed


def renew_traced(channel: Channel, name: str, capacity: int, label: str, ttl: float) -> None:
    """Take a key and send its lease and whether the C steps run, then let the test trace
    this process (``PTRACE_TRACEME``), stop, renew the key once and stop again: the test
    runs the renewal one instruction at a time."""
    table, lease = _renewed_holder(channel, name, capacity, label, ttl)
    channel.send(table._steps is not None)
    trace_me()
    os.kill(os.getpid(), signal.SIGSTOP)
    table.renew(lease, ttl)
    os.kill(os.getpid(), signal.SIGSTOP)


def stop_in_a_section_owning_a_resource(channel: Channel, name: str, capacity: int) -> None:
    """Register one pool resource, then acquire KEY and stop (SIGSTOP) inside the lock
    table's critical section, its slot TOMBSTONE, after sending ``(node, incarnation)``;
    the test SIGKILLs it there."""
    fleet = Fleet.join(name, capacity)
    Pool(fleet).register(Key(0x5EED), 1)
    table = LockTable(fleet)

    def hook(point: str) -> None:
        if point == "tombstoned":
            channel.send((fleet.node, fleet.incarnation))
            os.kill(os.getpid(), signal.SIGSTOP)

    _steps.crash_hook = hook
    table.try_acquire(KEY, LockOwner(b"victim"), ttl=60.0)


def stop_in_the_pools_section(channel: Channel, name: str, capacity: int) -> None:
    """Open the fleet's pool and stop (SIGSTOP) inside its table's critical section, after
    sending ``"inside"``; the test SIGKILLs it there."""
    pool = Pool(Fleet.join(name, capacity))
    pool._table.region.acquire()
    channel.send("inside")
    os.kill(os.getpid(), signal.SIGSTOP)


def report_node(channel: Channel, fleet: Fleet) -> None:
    """Fork-only: report ``fleet.node`` as a forked child sees it through the parent's Fleet.

    Sends ``("node", node)`` or ``("raised", error)``, then waits for one message.
    """
    try:
        channel.send(("node", fleet.node))
    except OrbitError as error:
        channel.send(("raised", error))
    channel.recv(timeout=None)


def try_twice_in_child(channel: Channel, fleet: Fleet, table: LockTable) -> None:
    """Fork-only: ``fleet.node`` twice, then ``table.try_acquire`` twice; report each outcome.

    Sends a list of "node N" / "acquired" / "occupied" / the error class name.
    """
    outcomes: list[str] = []
    for _ in range(2):
        try:
            outcomes.append(f"node {fleet.node}")
        except OrbitError as error:
            outcomes.append(type(error).__name__)
    for _ in range(2):
        try:
            result = table.try_acquire(OTHER_KEY, LockOwner(b"child"), 30.0)
        except OrbitError as error:
            outcomes.append(type(error).__name__)
        else:
            outcomes.append("acquired" if isinstance(result, Acquired) else "occupied")
    channel.send(outcomes)


def fork_child_exits_normally(name: str, child_closes: str) -> None:
    """Run in a fresh interpreter: hold KEY, fork a child that exits normally, re-check.

    The child uses the inherited table (a lookup and an acquire of its own),
    optionally closes the table and the fleet (``child_closes == "close"``),
    drops every reference, collects garbage and returns, so its interpreter
    shuts down normally with atexit handlers. Prints a JSON report.
    """
    fleet = Fleet.join(name, 4)
    table = LockTable(fleet)
    result = table.try_acquire(KEY, LockOwner(b"parent"), ttl=60.0)
    assert isinstance(result, Acquired)
    held = result.lease
    pid = os.fork()
    if pid == 0:
        assert table.current(KEY) == held
        table.try_acquire(OTHER_KEY, LockOwner(b"child"), ttl=60.0)
        if child_closes == "close":
            table.close()
            fleet.close()
        del table, fleet
        gc.collect()
        return  # the interpreter exits normally: atexit, finalisers, no os._exit
    _, status = os.waitpid(pid, 0)
    lookup = table.current(KEY)
    report = {
        "child_status": status,
        "intact": lookup == held,
        "node_alive": fleet.is_alive(fleet.node),
        "node": fleet.node,
        "revision_before": held.state_revision,
        "other_held": table.current(OTHER_KEY) is not None,
    }
    sys.stdout.write(json.dumps(report))


#: Frame shape of :func:`publish_until_killed`: ver is repeated in the head and the body.
FRAME_HEAD = struct.Struct("<Q")
FRAME_REPEAT = 30


def publish_until_killed(
    channel: Channel, name: str, capacity: int, geometry: RingGeometry
) -> None:
    """Publish frames on this node's lane as fast as possible until SIGKILLed.

    Frame number ``n`` has ``ver == n``, head ``(n,)`` and a body of ``n`` packed
    FRAME_REPEAT times, so a torn frame cannot pass for a whole one.
    """
    fleet = Fleet.join(name, capacity)
    ring = Ring(fleet, geometry, FRAME_HEAD)
    node = fleet.node
    number = 1
    while True:
        body = FRAME_HEAD.pack(number) * FRAME_REPEAT
        ring.publish(node, 1, number, (number,), body)
        if number == 1:
            channel.send(("ready", node))  # after one whole frame, however slow the start
        number += 1


def lock_table_member(channel: Channel, name: str, capacity: int) -> None:
    """Join fleet ``name`` (lowest free node) and use only its lock table, as ``orbit run
    --store shm://`` does: no pool is opened. Sends (node, incarnation), then waits."""
    fleet = Fleet.join(name, capacity)
    table = LockTable(fleet)
    table.try_acquire(OTHER_KEY, LockOwner(b"lock-table-member"), ttl=60.0)
    channel.send((fleet.node, fleet.incarnation))
    time.sleep(3600)


def sleep_forever(channel: Channel) -> None:
    """Block until killed."""
    channel.send("sleeping")
    time.sleep(3600)


#: Witness of :func:`stripe_churn`, per tracked key: the holder's thread id, the last
#: fencing token; after them, at ``STRIPE_BREACH_AT``, what went wrong first (0: nothing).
STRIPE_WITNESS = struct.Struct("<QQ")


def stripe_churn(
    channel: Channel,
    name: str,
    layout: LockLayout,
    tracked: list[LockKey],
    expiring: list[LockKey],
    witness: str,
    python: bool,
    seconds: float,
) -> None:
    """Two threads take and give back ``tracked`` keys, checking the witness; send counts.

    Each holder writes its thread id into its key's witness entry (which must be
    free), checks the fencing token grew, renews, clears the entry and releases
    (which must succeed). Keys of ``expiring`` are taken for a millisecond and
    left, so probes meet expired entries to reclaim. ``python``: the Python steps.
    """
    table = LockTable(Fleet.join(name, 8), layout)
    if python:
        table._bind(None)
    with open(witness, "r+b") as file:
        shared = mmap.mmap(file.fileno(), 0)
    breach_at = STRIPE_WITNESS.size * len(tracked)
    owner = LockOwner(f"churner-{os.getpid()}")
    counts = [0, 0]
    errors: list[str] = []

    def breach(code: int) -> None:
        if not int.from_bytes(shared[breach_at : breach_at + 8], "little"):
            shared[breach_at : breach_at + 8] = code.to_bytes(8, "little")

    def run(index: int) -> None:
        try:
            churn(index)
        except BaseException as error:  # sent to the test, which fails on it
            errors.append(repr(error))

    def churn(index: int) -> None:
        me = threading.get_native_id()
        rng = random.Random(me)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if rng.random() < 0.1:
                table.try_acquire(rng.choice(expiring), owner, 0.001)
                continue
            number = rng.randrange(len(tracked))
            got = table.try_acquire(tracked[number], owner, 30.0)
            if not isinstance(got, Acquired):
                continue
            at = number * STRIPE_WITNESS.size
            holder, last = STRIPE_WITNESS.unpack_from(shared, at)
            token = got.lease.lock_id & ((1 << 40) - 1)
            if holder:
                breach(1)  # two holders of one key
            if token <= last:
                breach(2)  # a fencing token that did not grow
            STRIPE_WITNESS.pack_into(shared, at, me, token)
            if table.renew(got.lease, 30.0) is None:
                breach(3)
            STRIPE_WITNESS.pack_into(shared, at, 0, token)
            if not table.release(got.lease):
                breach(4)
            counts[index] += 1

    threads = [threading.Thread(target=run, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    table.close()
    channel.send((counts, errors))


def cycle_key(
    channel: Channel, name: str, layout: LockLayout, key: LockKey, seconds: float
) -> None:
    """Take and give back ``key`` on the C steps for ``seconds``; send how many times."""
    table = LockTable(Fleet.join(name, 8), layout)
    owner = LockOwner(f"cycler-{os.getpid()}")
    channel.send("running")
    cycles = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = table.try_acquire(key, owner, 30.0)
        assert isinstance(got, Acquired), got
        assert table.release(got.lease)
        cycles += 1
    table.close()
    channel.send(cycles)


def wait_for_key(
    channel: Channel,
    name: str,
    capacity: int,
    label: str,
    queue_s: float = 0.0,
    wait_cap_s: float = 0.0,
) -> None:
    """Join, say ("waiting", node), and once told wait for the key ``label`` (behind its
    waiters first, for at most ``queue_s`` seconds, when that is not 0; sleeping at most
    ``wait_cap_s`` seconds at a time, when that is not 0, instead of WAIT_CAP_S); report
    ("granted", at). Then hold it until told, release it and say how many nodes were
    waiting then.
    """
    # The child's own copy of the module (it ends with the child): no undo needed.
    if queue_s:
        setattr(_key_wait, "QUEUE_S", queue_s)  # noqa: B010 (Final to mypy)
    if wait_cap_s:
        setattr(_key_wait, "WAIT_CAP_S", wait_cap_s)  # noqa: B010 (Final to mypy)
    with Fleet.join(name, capacity) as fleet:
        table = LockTable(fleet)
        key = LockKey("tests.children", label)
        channel.send(("waiting", fleet.node))
        channel.recv(None)
        owner = LockOwner(f"waiter-{fleet.node}".encode())
        result = table.wait_acquire(key, owner, 60.0, 30.0, queue=bool(queue_s))
        channel.send(
            ("granted", time.monotonic()) if isinstance(result, Acquired) else ("timed out",)
        )
        channel.recv(None)
        channel.send(("released", table.release_waking(result.lease)))
        channel.recv(None)
