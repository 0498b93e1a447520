"""Processes on the C steps, on keys whose probe chains cross stripe edges, killed at random.

The table is ``EDGE`` (64 slots, 32 stripes of 2) and the keys are ``EDGE_KEYS``,
whose homes are the last slot of a stripe (a quarter of them the table's last, so
their chains wrap): the C steps hold several stripes, extend what they hold, or
let go and take every stripe. Keys of ``EXPIRING`` are taken for a millisecond,
so probes meet expired entries to reclaim. Each churner runs two threads; the test
SIGKILLs churners at random moments and checks, after every kill, that the table
answers (no wedge) and holds each key at most once, and that no tenure of a key
began before the one before it ended, that the fencing token grew, and that a
renewal or release of a tenure not yet over found it (a shared witness of each
key's last expiry and token). Afterwards every key can be acquired.
"""

from __future__ import annotations

import mmap
import os
import random
import struct
import threading
import time
from collections import Counter

from orbitive import Fleet
from orbitive._core._robust import SECTION_MUTEX_AT, SECTION_STRIPE_BYTES, RobustMutex, _libc
from orbitive._core._section import recoveries
from orbitive.lock import Acquired, LockKey, LockOwner, LockTable
from orbitive.lock._layout import MAX_PROBE_OFFSET

from .._capabilities import require_c_steps
from .._processes import Channel, Processes
from ..lock.test_stripes import EDGE, EDGE_KEYS, EXPIRING

#: Tenures long enough that a churner slowed by a busy machine does not outlive its
#: own, short enough that a killed holder's keys come free within the test.
TTL = 0.5
KILLS = 60
#: Kills at most, until one landed inside a section (a stripe mutex repaired).
MOST_KILLS = 150
#: Per tracked key: the expiry (ms) of the tenure being held (0: released), its token.
WITNESS = struct.Struct("<QQ")
BREACH_AT = WITNESS.size * len(EDGE_KEYS)
WITNESS_BYTES = BREACH_AT + 8
#: How long a check after a kill may take before the table counts as wedged.
ANSWER_WITHIN = 10.0


def _before(expires_at: float) -> bool:
    """Whether a tenure ending at ``expires_at`` is surely not over yet (50 ms to spare)."""
    return time.monotonic() < expires_at - 0.05


def _hold(table: LockTable, witness: mmap.mmap, owner: LockOwner) -> None:
    rng = random.Random(threading.get_native_id())
    while True:
        if rng.random() < 0.1:
            table.try_acquire(rng.choice(EXPIRING), owner, 0.001)
            continue
        number = rng.randrange(len(EDGE_KEYS))
        got = table.try_acquire(EDGE_KEYS[number], owner, TTL)
        if not isinstance(got, Acquired):
            continue
        at = number * WITNESS.size
        ends, last = WITNESS.unpack_from(witness, at)
        token = got.lease.lock_id & ((1 << 40) - 1)
        # Read while this tenure was live (else a successor's entry may be there already).
        judged = _before(got.lease.expires_at)
        if judged and (round(got.lease.acquired_at * 1000) < ends or token <= last):
            witness[BREACH_AT:] = (1 + number).to_bytes(8, "little")
        WITNESS.pack_into(witness, at, round(got.lease.expires_at * 1000), token)
        renewed = table.renew(got.lease, TTL)
        if renewed is None and _before(got.lease.expires_at):
            witness[BREACH_AT:] = (1 + number).to_bytes(8, "little")  # the entry was lost
        if renewed is not None:
            WITNESS.pack_into(witness, at, round(renewed.expires_at * 1000), token)
        lease = renewed or got.lease
        WITNESS.pack_into(witness, at, 0, token)
        if not table.release(lease) and _before(lease.expires_at):
            witness[BREACH_AT:] = (1 + number).to_bytes(8, "little")


def churn(channel: Channel, fleet_name: str, witness_fd: int) -> None:
    table = LockTable(Fleet.join(fleet_name, 8), EDGE)
    witness = mmap.mmap(witness_fd, WITNESS_BYTES)
    owner = LockOwner(f"churner-{os.getpid()}")
    for _ in range(2):
        threading.Thread(target=_hold, args=(table, witness, owner), daemon=True).start()
    channel.send(table._steps is not None)
    threading.Event().wait()


def _check(table: LockTable) -> None:
    """Statistics answer, and no key is held twice (in a thread: a wedge fails, not hangs)."""
    found: list[tuple[bool, int]] = []

    def look() -> None:
        statistics = table.statistics()
        keys = Counter(lease.key for lease in table.leases())
        found.append((statistics.max_probe < EDGE.capacity, max(keys.values(), default=0)))

    looker = threading.Thread(target=look, daemon=True)
    looker.start()
    looker.join(ANSWER_WITHIN)
    assert found, f"the table did not answer within {ANSWER_WITHIN} s (a wedged stripe)"
    bounded, most = found[0]
    assert bounded and most <= 1, found[0]


def test_c_churners_on_edge_keys_killed_at_random_leave_a_working_table(fleet_name: str) -> None:
    witness_fd = os.memfd_create("orbit-stripe-witness")
    os.ftruncate(witness_fd, WITNESS_BYTES)
    witness = mmap.mmap(witness_fd, WITNESS_BYTES)
    table = LockTable(Fleet.join(fleet_name, 8), EDGE)
    require_c_steps(table._steps, "orbitive.lock._fastpath")
    rng = random.Random(20261201)
    with Processes("fork") as processes:
        children = [processes.start(churn, fleet_name, witness_fd) for _ in range(3)]
        assert all(child.recv() for child in children)  # every churner is on the C steps
        kills = 0
        while kills < KILLS or (recoveries(table._state.block) == 0 and kills < MOST_KILLS):
            victim, kills = kills % len(children), kills + 1
            time.sleep(rng.uniform(0.0, 0.03))
            children[victim].kill()
            _check(table)
            children[victim] = processes.start(churn, fleet_name, witness_fd)
            assert children[victim].recv()
    breach = int.from_bytes(witness[BREACH_AT:], "little")
    assert breach == 0, f"{EDGE_KEYS[breach - 1]}: a tenure overlapped, or was lost"
    assert recoveries(table._state.block) >= 1, f"no kill of {kills} landed inside a section"
    time.sleep(TTL)  # every killed holder's tenure has ended
    for key in EDGE_KEYS + EXPIRING:
        got = table.try_acquire(key, LockOwner(b"tester"), 30.0)
        assert isinstance(got, Acquired), (key, got)
        assert table.release(got.lease)
    os.close(witness_fd)
    table.unlink()


def acquire_once(channel: Channel, fleet_name: str, key: LockKey) -> None:
    """Send this thread's id, then take ``key`` on the C steps (it waits, until killed)."""
    table = LockTable(Fleet.join(fleet_name, 8), EDGE)
    channel.send(threading.get_native_id())
    table.try_acquire(key, LockOwner(b"victim"), 30.0)
    channel.send("acquired")


def _home_keys(home: int, count: int) -> list[LockKey]:
    keys = (LockKey("tests.stripe-kill", f"home-{n}") for n in range(100_000))
    return [key for key in keys if key.digest & (EDGE.capacity - 1) == home][:count]


def test_a_step_killed_while_it_takes_every_stripe_leaves_each_one_repaired(
    fleet_name: str,
) -> None:
    slots = EDGE.capacity // EDGE.stripes
    resident, victim_key = _home_keys(slots, 2)  # both at home on stripe 1's first slot
    table = LockTable(Fleet.join(fleet_name, 8), EDGE)
    require_c_steps(table._steps, "orbitive.lock._fastpath")
    assert isinstance(table.try_acquire(resident, LockOwner(b"resident"), 600.0), Acquired)
    bound = table._buf[MAX_PROBE_OFFSET : MAX_PROBE_OFFSET + 4]
    assert bound == bytes(4)  # the victim's probe: its home slot only, then every stripe
    block = table._state.block
    stripes = RobustMutex(block, EDGE.stripes)
    assert _libc is not None
    stripes._lock(stripes._mutexes[2])

    def owner_of(stripe: int) -> int:
        at = SECTION_MUTEX_AT + stripe * SECTION_STRIPE_BYTES
        return int.from_bytes(block[at : at + 4], "little") & 0x3FFFFFFF

    before = recoveries(block)
    with Processes("fork") as processes:
        victim = processes.start(acquire_once, fleet_name, victim_key)
        tid: int = victim.recv()
        deadline = time.monotonic() + 10.0
        while owner_of(1) != tid and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # it holds stripes 0 and 1 and waits for stripe 2
        assert [owner_of(0), owner_of(1)] == [tid, tid]
        assert victim.kill() < 0
    _libc.pthread_mutex_unlock(stripes._mutexes[2])
    _check(table)
    assert recoveries(block) == before + 2
    got = table.try_acquire(victim_key, LockOwner(b"after"), 30.0)
    assert isinstance(got, Acquired) and got.lease.slot == slots + 1
    table.unlink()
