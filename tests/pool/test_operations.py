"""The C operations (``Pool.reserve``, ``Pool.accept``, ``Execution.complete``, and a client
pool's ``take`` and ``give_back``, as one C call each) against the Python operations: same
results, same errors, same table bytes.

Two pools on fleets of one geometry get the same random operations on ids and
leases both real and made up (another generation or epoch, a fence never handed
out, odd field values): one runs the C operations, the other (``_bind(None)``)
the Python reference with the Python ``Execution`` twin. After every operation
the outcomes and every byte of the two tables but the reservation timestamps
(each side reads the wall clock itself) must be equal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import itertools
import random
from collections.abc import Callable, Iterator

import pytest

from orbitive import Fleet
from orbitive._core._errors import MalformedError, OrbitError
from orbitive._core._region import store
from orbitive.pool import Execution, Incarnation, Key, Lease, Pool, ResourceId
from orbitive.pool._availability import add_waiter
from orbitive.pool._execution import PythonExecution
from orbitive.pool._layout import (
    RES_ACTIVE,
    RES_KEY_INDEX,
    RES_SINCE,
    RESOURCE_SIZE,
    U64,
    write_header,
)
from orbitive.pool._table import Table

from .._capabilities import require_c_steps
from .._fleets import new_fleet_name, remove_fleet_files

KEYS = [Key(0xA11CE), Key(0xB0B)]
EPOCH = 0x1234_5678_9ABC
LIFE = 11
RES_INCARNATION = 8  # the owner's incarnation in a resource slot
#: Bytes 56..64 of a resource slot hold the last reservation's time, and RES_SINCE
#: the pending entries' times: the two sides read the clock apart.
LAST_RESERVE = slice(56, 64)


@pytest.fixture(params=["join", "local"])
def pools(request: pytest.FixtureRequest) -> Iterator[tuple[Pool, Pool]]:
    names = [new_fleet_name(), new_fleet_name()]
    make = Fleet.join if request.param == "join" else Fleet.local
    fleets = [make(name, 3) for name in names]
    fast, slow = (Pool(fleet, Incarnation(LIFE)) for fleet in fleets)
    slow._bind(None)  # the Python reference
    for pool in (fast, slow):  # one epoch, one owner life and one fleet life: equal bytes
        table = pool._table
        write_header(table.buf, table.layout, EPOCH)
        store(table.buf, table.layout.bell_lives, U64, LIFE)
    yield fast, slow
    for pool, fleet, name in zip((fast, slow), fleets, names, strict=True):
        pool.close()
        fleet.close()
        remove_fleet_files(name)


def test_the_c_operations_are_the_pools_own(pools: tuple[Pool, Pool]) -> None:
    fast, slow = pools
    require_c_steps(fast._operations, "orbitive.pool._fastpath")
    assert "reserve" in vars(fast) and "accept" in vars(fast)
    assert "reserve" not in vars(slow)
    assert slow._operations is None
    rid = fast.register(KEYS[0], 1)
    execution = fast.accept(fast.reserve(rid))
    assert type(execution) is Execution and Execution is not PythonExecution
    execution.complete()


def test_the_c_give_back_decides_with_waiters_and_an_idle_bound_itself(
    pools: tuple[Pool, Pool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While processes wait, or max_idle is below max_live, the C give-back counts the
    key and decides in its one call: the Python step is never asked."""
    fast = pools[0]
    require_c_steps(fast._operations, "orbitive.pool._fastpath")
    operations = fast._operations
    assert operations is not None
    asked: list[object] = []
    monkeypatch.setattr(fast, "_give_back", lambda *args: asked.append(args))
    rid, other = (fast._table.register(KEYS[0], 1, 1) for _ in range(2))  # both in use
    assert operations.give_back(rid, 0, 4, False, False) is False  # max_idle 0: retire
    assert operations.give_back(rid, 1, 4, False, False) is True  # first idle unit: kept
    with as_other_node(fast) as table:
        add_waiter(table, KEYS[0], 1)
        table.register(KEYS[0], 1, 1)
    changes = fast._table.changes(0)
    # A waiter elsewhere at max_live 3 (three live clients): retired, unless in turn.
    assert operations.give_back(other, 4, 3, False, False) is False
    assert operations.give_back(other, 4, 3, True, False) is True
    assert fast._table.changes(0) == changes  # nobody here could take it: nobody woken
    assert asked == []


#: Small keys, as (clients of ours, in use; node 1's in use; node 1's idle; waiters of
#: ours; waiters of node 1; node 1's creation claims; node 1's idle client damaged;
#: node 2's clients in use, a node that does not wait).
SMALL_KEYS = list(
    itertools.product(range(1, 4), range(3), range(2), (0, 1), (0, 2), (0, 1), (0, 1), (0, 2))
)


def give_backs(pool: Pool, small_key: tuple[int, ...]) -> list[bool]:
    """Build ``small_key`` on KEYS[0], give one client back under every small bound (taking
    it again when kept), then empty the key; returns each give-back's outcome."""
    mine, busy, idle, own_waiters, other_waiters, creating, damaged, third = small_key
    table = pool._table
    rids = [table.register(KEYS[0], 1, 1) for _ in range(mine)]
    with as_other_node(pool, 2) as other:
        thirds = [other.register(KEYS[0], 1, 1) for _ in range(third)]
    with as_other_node(pool) as other:
        others = [other.register(KEYS[0], 1, 1) for _ in range(busy)]
        others += [other.register(KEYS[0], 1, 0) for _ in range(idle)]
    if damaged and idle:  # an active count past the capacity: no free unit, not minus one
        at = table.locate(others[-1]) + RES_ACTIVE
        table.buf[at : at + 4] = (0xFFFF_FFFF).to_bytes(4, "little")
    index_at = table.locate(rids[0]) + RES_KEY_INDEX
    at = table.key_offset(int.from_bytes(table.buf[index_at : index_at + 4], "little"))
    counters = [(table.key_waiters, 0, own_waiters), (table.key_waiters, 1, other_waiters)]
    counters.append((table.key_claims, 1, creating))
    for field, node, value in counters:
        table.buf[at + field + 4 * node : at + field + 4 * node + 4] = value.to_bytes(4, "little")
    take, give_back = unit_steps(pool)
    kept = []
    for max_live in range(1, 6):
        for max_idle, in_turn, borrowers in itertools.product(
            range(max_live + 1), (False, True), (False, True)
        ):
            kept.append(give_back(rids[0], max_idle, max_live, in_turn, borrowers))
            if kept[-1]:
                take(rids[0])
    for field, node, _ in counters:
        table.buf[at + field + 4 * node : at + field + 4 * node + 4] = bytes(4)
    for rid in rids:
        table.close(rid)
    for node, theirs in ((1, others), (2, thirds)):
        with as_other_node(pool, node) as other:
            for rid in theirs:
                other.close(rid)
    return kept


def test_c_and_python_give_back_decide_alike_on_every_small_key(pools: tuple[Pool, Pool]) -> None:
    """Every branch of the decision: waiters here and elsewhere, at max_live or not, in
    turn or not, fair share, a poorer waiting node, idle bounds, a damaged count."""
    require_c_steps(pools[0]._operations, "orbitive.pool._fastpath")
    for small_key in SMALL_KEYS:
        outcomes = [give_backs(pool, small_key) for pool in pools]
        assert outcomes[0] == outcomes[1], small_key
        assert table_bytes(pools[0]) == table_bytes(pools[1]), small_key


def table_bytes(pool: Pool) -> bytes:
    """The pool table without its timestamps: the reservations', and the waiting nodes'
    (when their waiting began and last tried, ``time.monotonic()`` ms)."""
    table, layout = pool._table, pool._table.layout
    data = bytearray(table.buf[: layout.size])
    for offset in range(table.res_base, layout.size, RESOURCE_SIZE):
        data[offset + LAST_RESERVE.start : offset + LAST_RESERVE.stop] = bytes(8)
        data[offset + RES_SINCE : offset + RES_SINCE + 128] = bytes(128)
    times = layout.key_members - layout.key_wait_since  # both per-node time arrays
    for index in range(table.key_capacity):
        at = table.key_offset(index) + layout.key_wait_since
        data[at : at + times] = bytes(times)
    return bytes(data)


def outcome(call: object) -> object:
    """What a call gave: a value's shape, or the error's class."""
    try:
        result = call() if callable(call) else call
    except OrbitError as error:
        return type(error)
    if isinstance(result, (Execution, PythonExecution)):
        return ("execution", result.id, result.fence, result.done)
    return result


def odd_rid(rng: random.Random, rid: ResourceId) -> ResourceId:
    field = rng.choice(["generation", "epoch", "slot", "node"])
    return dataclasses.replace(rid, **{field: getattr(rid, field) + 1})


@dataclasses.dataclass
class Side:
    """What one pool handed out so far."""

    rids: list[ResourceId] = dataclasses.field(default_factory=list)
    leases: list[Lease] = dataclasses.field(default_factory=list)
    units: list[Execution] = dataclasses.field(default_factory=list)
    others: list[ResourceId] = dataclasses.field(default_factory=list)  # node 1's


KINDS = ["register"] + ["reserve", "accept", "complete"] * 4 + ["take", "give_back"] * 3
KINDS += ["waiter", "other_node", "other_node", "unregister"]
#: The same random operations with stray writes in between (see :func:`damage`).
DAMAGED_KINDS = KINDS + ["damage"] * 3
#: A stray write: (offset in a resource slot, bytes, the values written).
STRAY = [
    (RES_KEY_INDEX, 4, (1, 63, 64, 0xFFFF, 0xFFFF_FFFF)),  # the key index, past the table too
    (RES_ACTIVE, 4, (0, 1, 3, 0xFFFF_FFFF)),
    (RES_INCARNATION, 8, (LIFE + 1, 0, (1 << 64) - 1)),  # another owner's life
]


def unit_steps(pool: Pool) -> tuple[Callable[..., None], Callable[..., bool]]:
    """The pool's owner take and give-back: the C operations, or the Python ones."""
    operations = pool._operations
    if operations is None:
        return pool._take, pool._give_back
    return operations.take, operations.give_back


def run_availability(pool: Pool, kind: str, rid: ResourceId, pick: float) -> object:
    """One take, give-back (each bound tried) or waiter count in or out."""
    take, give_back = unit_steps(pool)
    if kind == "take":
        return outcome(lambda: take(rid))
    if kind == "give_back":
        max_live = 1 + int(pick * 4)
        max_idle = max_live if pick < 0.6 else int(pick * 10) % (max_live + 1)
        return outcome(lambda: give_back(rid, max_idle, max_live, pick < 0.3, pick > 0.8))
    delta = 1 if pick < 0.6 else -1
    return outcome(lambda: add_waiter(pool._table, rng_key(pick), delta))


@contextlib.contextmanager
def as_other_node(pool: Pool, node: int = 1) -> Iterator[Table]:
    """The pool's table acting as ``node`` (another process of the fleet) for one step."""
    table = pool._table
    identity = table.node, table.incarnation
    table.node, table.incarnation = node, LIFE + node
    try:
        yield table
    finally:
        table.node, table.incarnation = identity


def run_other_node(pool: Pool, others: list[ResourceId], pick: float) -> object:
    """Node 1 registers a client (in use or idle), closes one, or counts a waiter in or
    out, so that a give-back's census sees other nodes' clients and waiters."""
    with as_other_node(pool) as table:
        if pick < 0.3:
            rid = table.register(rng_key(pick), 1, int(pick * 10) % 2)
            others.append(rid)
            return rid
        if pick < 0.5 and others:
            return outcome(functools.partial(table.close, others.pop(int(pick * len(others)))))
        return outcome(lambda: add_waiter(table, rng_key(pick), 1 if pick < 0.75 else -1))


def damage(pool: Pool, rid: ResourceId, pick: float) -> None:
    """A stray write of ``pick``'s choosing into ``rid``'s slot, or a key's waiter counter."""
    table = pool._table
    choice = int(pick * 1000)
    if choice % 4 == 3:  # a garbage waiter count of some node on some key
        node, key = choice % table.fleet_capacity, choice % table.key_capacity
        value = (0, 1, 0xFFFF_FFFF)[choice % 3]
        at, size = table.key_offset(key) + table.key_waiters + 4 * node, 4
    else:
        field, size, values = STRAY[choice % 4]
        at, value = table.locate(rid) + field, values[choice % len(values)]
    table.buf[at : at + size] = value.to_bytes(size, "little")


def run_both(pools: tuple[Pool, Pool], seed: int, steps: int, kinds: list[str] = KINDS) -> None:
    rng = random.Random(seed)
    sides = [Side() for _ in pools]
    for _ in range(steps):
        kind = rng.choice(kinds)
        pick = rng.random()
        results = []
        for pool, mine in zip(pools, sides, strict=True):
            rids, leases, units = mine.rids, mine.leases, mine.units
            if kind == "damage" and rids:
                damage(pool, rids[int(pick * len(rids))], pick)
                result = None
            elif kind == "other_node":
                result = run_other_node(pool, mine.others, pick)
            elif kind == "unregister" and rids:
                result = outcome(
                    functools.partial(pool.unregister, rids.pop(int(pick * len(rids))))
                )
            elif kind in ("take", "give_back", "waiter") and rids:
                rid = rids[int(pick * len(rids))]
                if pick < 0.1:
                    rid = odd_rid(random.Random(seed + len(rids)), rid)
                result = run_availability(pool, kind, rid, pick)
            elif kind == "register" or not rids:
                result = outcome(pool.register(rng_key(pick), 1 + int(pick * 3)))
                if isinstance(result, ResourceId):
                    rids.append(result)
            elif kind == "reserve":
                rid = rids[int(pick * len(rids))]
                if pick < 0.1:
                    rid = odd_rid(random.Random(seed + len(rids)), rid)
                result = outcome(_reserve(pool, rid))
                if isinstance(result, Lease):
                    leases.append(result)
            elif kind == "accept" and leases:
                lease = leases.pop(int(pick * len(leases)))
                if pick < 0.1:
                    lease = dataclasses.replace(lease, fence=lease.fence + 7)
                found = lease
                executed = _accept(pool, found)
                result = outcome(executed)
                if isinstance(executed, Execution):
                    units.append(executed)
            elif units:
                unit = units.pop(int(pick * len(units)))
                result = outcome(unit.complete)
            else:
                result = None
            results.append(_comparable(result))
        assert results[0] == results[1], (kind, results)
        assert table_bytes(pools[0]) == table_bytes(pools[1]), kind
    for mine in sides:
        for unit in mine.units:
            unit.complete()


def _reserve(pool: Pool, rid: ResourceId) -> object:
    try:
        return pool.reserve(rid)
    except OrbitError as error:
        return error


def _accept(pool: Pool, lease: Lease) -> object:
    try:
        return pool.accept(lease)
    except OrbitError as error:
        return error


def _comparable(result: object) -> object:
    if isinstance(result, OrbitError):
        return type(result)
    if isinstance(result, Lease):
        return (result.id, result.fence)
    return result


def rng_key(pick: float) -> Key:
    return KEYS[int(pick * len(KEYS))]


@pytest.mark.parametrize("seed", range(3))
def test_c_and_python_operations_leave_the_same_table(pools: tuple[Pool, Pool], seed: int) -> None:
    run_both(pools, seed, 300)


@pytest.mark.parametrize("seed", range(4))
def test_c_and_python_operations_agree_on_a_table_damaged_in_between(
    pools: tuple[Pool, Pool], seed: int
) -> None:
    """Stray key indexes (past the key table too), active counts, owner lives, waiter counts."""
    run_both(pools, 100 + seed, 300, DAMAGED_KINDS)


@pytest.mark.parametrize("twin", ["c", "python"])
def test_an_execution_dropped_without_complete_warns_and_gives_its_unit_back(
    pools: tuple[Pool, Pool], twin: str
) -> None:
    pool = pools[0]
    rid = pool.register(KEYS[0], 1)
    lease = pool.reserve(rid)
    if twin == "c":
        execution: object = pool.accept(lease)
    else:  # the Python twin over the same accepted unit
        table = pool._table
        execution = PythonExecution(table, rid, lease.fence, table.accept(rid, lease.fence))
    with pytest.raises(OrbitError):
        pool.reserve(rid)  # the one unit is in use
    with pytest.warns(ResourceWarning, match="never completed"):
        del execution
        gc.collect()
    pool.accept(pool.reserve(rid)).complete()  # the unit came back


def test_the_c_execution_is_idempotent_and_a_context_manager(pools: tuple[Pool, Pool]) -> None:
    pool = pools[0]
    rid = pool.register(KEYS[1], 1)
    with pool.accept(pool.reserve(rid)) as execution:
        assert not execution.done
        assert repr(execution).endswith("active>")
    assert execution.done
    execution.complete()  # a second complete gives nothing back twice
    lease = pool.reserve(rid)
    with pytest.raises(OrbitError):
        pool.reserve(rid)
    pool.accept(lease).complete()


def test_after_close_the_c_operations_hand_over_and_refuse_by_name(
    pools: tuple[Pool, Pool],
) -> None:
    pool = pools[0]
    rid = pool.register(KEYS[0], 1)
    pool.close()
    assert "reserve" not in vars(pool)
    with pytest.raises(OrbitError, match="closed"):
        pool.reserve(rid)


#: Bounds a give-back cannot take: not ints (a bool, a float, None, text), negative, past u32.
BAD_BOUNDS = [True, 1.5, None, "4", -1, 1 << 32, 1 << 64]


@pytest.mark.parametrize("bound", BAD_BOUNDS, ids=repr)
@pytest.mark.parametrize("which", ["max_idle", "max_live"])
def test_a_give_back_with_a_bound_that_is_no_u32_is_malformed_in_both_twins(
    pools: tuple[Pool, Pool], bound: object, which: str
) -> None:
    for pool in pools:
        take, give_back = unit_steps(pool)
        rid = pool.register(KEYS[0], 1)
        take(rid)
        before = table_bytes(pool)
        bounds = (bound, 1) if which == "max_idle" else (1, bound)
        with pytest.raises(MalformedError, match=which):
            give_back(rid, *bounds, False, False)
        assert table_bytes(pool) == before  # the unit is still active


def foreign_ids(pool: Pool, rid: ResourceId) -> list[object]:
    """Ids no step of this table may act on: another kind, past its geometry, not ids."""
    table = pool._table
    return [
        dataclasses.replace(rid, kind=rid.kind ^ 1),
        dataclasses.replace(rid, node=table.fleet_capacity),
        dataclasses.replace(rid, slot=table.lane_capacity),
        dataclasses.replace(rid, node=0xFFFF, slot=0xFFFF),
        rid.raw,
        (rid.kind, rid.node, rid.slot, rid.generation, rid.epoch),
        None,
    ]


def test_take_and_give_back_refuse_an_id_of_another_kind_or_geometry_by_name(
    pools: tuple[Pool, Pool],
) -> None:
    for pool in pools:
        take, give_back = unit_steps(pool)
        rid = pool.register(KEYS[1], 2)
        before = table_bytes(pool)
        for foreign in foreign_ids(pool, rid):
            with pytest.raises(MalformedError):
                take(foreign)
            with pytest.raises(MalformedError):
                give_back(foreign, 2, 2, False, True)
        assert table_bytes(pool) == before
