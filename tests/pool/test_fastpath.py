"""The C steps (``pool/_fastpath.c``) against the Python steps: same results, same bytes.

Two pool tables of one small layout (two nodes, four keys, lanes of four) get
the same random operations: register, reserve, accept, complete, cancel, drain,
unregister and reconcile, on ids, fences and completions both real and made up
(an old generation, another epoch, a fence never handed out or out of range),
while the process switches between three (node, incarnation) identities so
the owner checks refuse too, and while slot fields are overwritten with odd
values as damaged memory would hold them. One table runs reserve, accept and
complete in C, the other in Python. Both read one wall clock that moves a
millisecond per operation, so after every operation the results, or the
raised errors, and every byte of the two tables must be equal.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Generic, TypeVar, cast

import pytest

from orbitive import Fleet
from orbitive._core._errors import (
    BusyError,
    LayoutMismatch,
    NotOwnerError,
    NotReservedError,
    OrbitError,
)
from orbitive.pool import _table as table_module
from orbitive.pool._layout import (
    RES_ACTIVE,
    RES_FENCE,
    RES_FENCES,
    RESOURCE_SIZE,
    Layout,
    write_header,
)
from orbitive.pool._opening import table_for
from orbitive.pool._table import Table
from orbitive.pool._values import Key, ResourceId

from .._capabilities import require_c_steps
from .._fleets import new_fleet_name, remove_fleet_files

if TYPE_CHECKING:
    from orbitive.pool._fastpath import Steps

_T = TypeVar("_T")
LAYOUT = Layout(kind=150, fleet_capacity=2, key_capacity=4, lane_capacity=4)
EPOCH = 0x1234_5678_9ABC
KEYS = [Key(n * 0x9E37_79B9_7F4A_7C15 + 1) for n in range(5)]  # five keys for four slots
#: The (node, incarnation) lives the process switches between.
LIVES = [(0, 11), (0, 12), (1, 11)]
#: Resource slot fields that damaged memory may change, as (offset, size): state, node,
#: generation, incarnation, capacity, key index, active, fence counter, epoch and three
#: pending fences; and the odd values written there.
FIELDS = [(0, 1), (2, 2), (4, 4), (8, 8), (32, 4), (36, 4), (40, 4), (48, 8), (64, 8)]
FIELDS += [(RES_FENCES + 8 * entry, 8) for entry in (0, 1, 15)]
ODD = [0, 1, 2, 3, 4, 5, 11, 255, 0xFFFF, 0xFFFF_FFFF, (1 << 64) - 1]


class Clock:
    """Wall-clock milliseconds that move only when told (both tables read the same)."""

    def __init__(self) -> None:
        self.now = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now


CLOCK = Clock()


@pytest.fixture(params=["join", "local"])
def pair(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Table, Table]]:
    """A table with the C steps and one with the Python steps, of one epoch and clock."""
    monkeypatch.setattr(table_module, "wall_ms", CLOCK)
    names = [new_fleet_name(), new_fleet_name()]
    make = Fleet.join if request.param == "join" else Fleet.local
    fleets = [make(name, LAYOUT.fleet_capacity) for name in names]
    fast, slow = (table_for(fleet, LAYOUT) for fleet in fleets)
    slow._steps = None  # the Python reference
    for table in (fast, slow):
        write_header(table.buf, LAYOUT, EPOCH)
        table.bind(*LIVES[0], LIVES[0][1])  # a pool life that is its fleet life
    yield fast, slow
    for fleet, name in zip(fleets, names, strict=True):
        fleet.close()
        remove_fleet_files(name)


@pytest.fixture
def steps(pair: tuple[Table, Table]) -> Steps:
    """The C steps of the first table of ``pair`` (the test is skipped if not built)."""
    if pair[0]._steps is None:
        pytest.skip("orbitive.pool._fastpath was not built")
    return pair[0]._steps


def test_the_c_steps_are_built_and_used(pair: tuple[Table, Table]) -> None:
    require_c_steps(pair[0]._steps, "orbitive.pool._fastpath")


@dataclasses.dataclass
class Items(Generic[_T]):
    """Things handed out: those still current (live, pending, active) and past ones."""

    current: list[_T] = dataclasses.field(default_factory=list)
    past: list[_T] = dataclasses.field(default_factory=list)

    def retire(self, item: _T) -> None:
        if item in self.current:
            self.current.remove(item)
            self.past.append(item)

    def pick(self, rng: random.Random) -> _T:
        """Mostly a current item, sometimes a past one."""
        if self.past and (not self.current or rng.random() < 0.15):
            return rng.choice(self.past)
        return rng.choice(self.current)


@dataclasses.dataclass
class History:
    """What the tables handed out so far, for later operations to name."""

    rids: Items[ResourceId] = dataclasses.field(default_factory=Items)
    leases: Items[tuple[ResourceId, int]] = dataclasses.field(default_factory=Items)
    units: Items[tuple[int, int, int]] = dataclasses.field(default_factory=Items)  # to complete

    def record(self, op: Op, result: object) -> None:
        """Note what a successful ``op`` handed out or took back."""
        if isinstance(result, tuple):  # an error
            return
        if op.name == "register" and isinstance(result, ResourceId):
            self.rids.current.append(result)
        elif op.name == "close":
            self.rids.retire(op.rid)
            for lease in [lease for lease in self.leases.current if lease[0] == op.rid]:
                self.leases.retire(lease)
        elif op.name == "reserve" and isinstance(result, int):
            self.leases.current.append((op.rid, result))
        elif op.name in ("accept", "cancel"):
            self.leases.retire((op.rid, cast(int, op.args[1])))
            if isinstance(result, int):
                self.units.current.append((result, op.rid.generation, op.rid.epoch))
        elif op.name == "complete":
            self.units.retire(cast(tuple[int, int, int], op.args))


@dataclasses.dataclass(frozen=True)
class Op:
    """A Table method, or one of :data:`TEST_STEPS`, and its arguments."""

    name: str
    args: tuple[object, ...]

    @property
    def rid(self) -> ResourceId:
        rid = self.args[0]
        assert isinstance(rid, ResourceId)
        return rid

    def run(self, table: Table) -> object:
        """The result, or the type and message of the error raised."""
        try:
            if self.name in TEST_STEPS:
                return TEST_STEPS[self.name](table, *self.args)
            return getattr(table, self.name)(*self.args)
        except OrbitError as error:
            return type(error), str(error)


def run_both(pair: tuple[Table, Table], op: Op) -> object:
    """Run ``op`` on both tables a millisecond on: the results and the tables must be equal."""
    CLOCK.now += 1
    result = op.run(pair[0])
    assert result == op.run(pair[1]), op
    assert pair[0].buf[: LAYOUT.size] == pair[1].buf[: LAYOUT.size], (op, result)
    return result


def set_life(table: Table, node: int, incarnation: int) -> None:
    """Act as another process life (its resources' owner checks then refuse this one)."""
    table.node, table.incarnation = node, incarnation


def damage(table: Table, rid: ResourceId, at: int, size: int, value: int) -> None:
    """Overwrite one field of ``rid``'s slot, as damaged memory would hold it."""
    offset = table.locate(rid) + at
    table.buf[offset : offset + size] = (value & ((1 << 8 * size) - 1)).to_bytes(size, "little")


TEST_STEPS: dict[str, Callable[..., None]] = {"life": set_life, "damage": damage}


def forged(rid: ResourceId, rng: random.Random) -> ResourceId:
    """Mostly ``rid``; else an id of its slot from another registration, epoch or lane."""
    field = rng.choices(["same", "generation", "epoch", "node"], [12, 1, 1, 1])[0]
    if field == "generation":
        return dataclasses.replace(rid, generation=rid.generation % 0xFFFFFF + 1)
    if field == "epoch":
        return dataclasses.replace(rid, epoch=rid.epoch + 1)
    if field == "node":
        return dataclasses.replace(rid, node=1 - rid.node)
    return rid


def draw(rng: random.Random, history: History) -> Op:
    """One random operation on what ``history`` names."""
    kind = rng.choices(
        ["register", "reserve", "accept", "complete", "cancel", "drain", "close", "reconcile",
         "life", "damage"],
        [3, 10, 8, 8, 2, 1, 3, 1, 1, 1],
    )[0]  # fmt: skip
    if kind == "register" or len(history.rids.current) < 2:
        return Op("register", (rng.choice(KEYS), rng.choice([1, 1, 2, 3, 20]), rng.choice([0, 1])))
    if kind == "life":
        return Op("life", rng.choices(LIVES, [6, 1, 1])[0])
    if kind == "damage":
        return Op(kind, (history.rids.pick(rng), *rng.choice(FIELDS), rng.choice(ODD)))
    if kind in ("accept", "cancel") and (history.leases.current or history.leases.past):
        rid, fence = history.leases.pick(rng)
        fence = rng.choice([fence] * 4 + [fence + 7, -fence, fence + (1 << 64)])
        extra = () if kind == "accept" else (rng.choice(LIVES),)  # cancel's holder
        return Op(kind, (forged(rid, rng), fence, *extra))
    if kind == "complete" and (history.units.current or history.units.past):
        offset, generation, epoch = history.units.pick(rng)
        later = rng.choices([(0, 0), (1, 0), (0, 1)], [6, 1, 1])[0]  # a stale completion
        return Op(kind, (offset, generation + later[0], epoch + later[1]))
    rid = forged(history.rids.pick(rng), rng)
    if kind == "reconcile":  # reservations older than the grace (in ms) are aged out
        return Op(kind, (rid, rng.choice([0, 1, 2]), rng.choice([-1, 0, 3, 10**9])))
    return Op(kind if kind in ("drain", "close") else "reserve", (rid,))


@pytest.mark.parametrize("seed", range(4))
def test_c_and_python_steps_leave_the_same_table(pair: tuple[Table, Table], seed: int) -> None:
    rng = random.Random(seed)
    history = History()
    for _ in range(400):
        op = draw(rng, history)
        history.record(op, run_both(pair, op))


def test_a_resource_holds_sixteen_pending_reservations_at_most(pair: tuple[Table, Table]) -> None:
    rid = run_both(pair, Op("register", (KEYS[0], 40, 0)))
    fences = [run_both(pair, Op("reserve", (rid,))) for _ in range(17)]
    assert fences[:16] == list(range(1, 17))
    assert fences[16] == (BusyError, f"resource {rid} has no free unit")


def _slot(table: Table, rid: ResourceId) -> bytes:
    offset = table.locate(rid)
    return table.buf[offset : offset + RESOURCE_SIZE]


def test_at_a_counter_limit_the_python_step_refuses_and_writes_nothing(
    pair: tuple[Table, Table],
) -> None:
    """The C steps decline at a counter's limit; the Python step raises (alike on both)."""
    rid = run_both(pair, Op("register", (KEYS[0], 3, 0)))
    assert isinstance(rid, ResourceId)
    run_both(pair, Op("damage", (rid, RES_FENCE, 8, (1 << 64) - 2)))
    assert run_both(pair, Op("reserve", (rid,))) == (1 << 64) - 1  # the last fence
    refused = run_both(pair, Op("accept", (rid, -1)))  # -1 is not that fence, nor any
    assert isinstance(refused, tuple) and refused[0] is NotReservedError
    before = _slot(pair[1], rid)
    spent = run_both(pair, Op("reserve", (rid,)))  # no fence after the last one
    assert isinstance(spent, tuple) and spent[0] is LayoutMismatch and "fence" in spent[1]
    assert _slot(pair[1], rid) == before
    run_both(pair, Op("damage", (rid, RES_ACTIVE, 4, (1 << 32) - 1)))
    before = _slot(pair[1], rid)
    full = run_both(pair, Op("accept", (rid, (1 << 64) - 1)))  # no room for one more unit
    assert isinstance(full, tuple) and full[0] is LayoutMismatch and "active" in full[1]
    assert _slot(pair[1], rid) == before  # the fence is still pending
    run_both(pair, Op("damage", (rid, RES_ACTIVE, 4, 3)))  # capacity 3 in use, yet a fence
    full = run_both(pair, Op("accept", (rid, (1 << 64) - 1)))
    assert isinstance(full, tuple) and full[0] is LayoutMismatch and "of capacity 3" in full[1]
    assert _slot(pair[1], rid) == before[:40] + bytes([3, 0, 0, 0]) + before[44:]
    run_both(pair, Op("damage", (rid, RES_ACTIVE, 4, 2)))
    assert run_both(pair, Op("accept", (rid, (1 << 64) - 1))) == pair[0].locate(rid)


def test_ints_out_of_range_equal_no_field(pair: tuple[Table, Table]) -> None:
    """Not even a field of all ones, which is what such an int wraps to in 64 bits."""
    rid = run_both(pair, Op("register", (KEYS[0], 3, 0)))
    assert isinstance(rid, ResourceId)
    fence = run_both(pair, Op("reserve", (rid,)))
    run_both(pair, Op("damage", (rid, 8, 8, (1 << 64) - 1)))  # the owner's incarnation
    run_both(pair, Op("life", (0, -1)))
    refused = run_both(pair, Op("accept", (rid, fence)))
    assert isinstance(refused, tuple) and refused[0] is NotOwnerError
    run_both(pair, Op("damage", (rid, 64, 8, (1 << 64) - 1)))  # the epoch
    run_both(pair, Op("damage", (rid, 40, 4, 1)))  # one active unit
    run_both(pair, Op("complete", (pair[0].locate(rid), rid.generation, -1)))
    assert pair[0].buf[pair[0].locate(rid) + 40] == 1  # not returned


def test_steps_check_their_slot_offset_and_arguments(steps: Steps) -> None:
    first = LAYOUT.resources
    for offset in (first - RESOURCE_SIZE, first + 1, LAYOUT.size, LAYOUT.size - 8, 1 << 70):
        with pytest.raises(ValueError, match="offset"):
            steps.complete(offset, 1, EPOCH)
    with pytest.raises(TypeError):
        steps.complete(str(first), 1, EPOCH)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        steps.reserve(first, 0, 1.0, EPOCH, 0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        steps.accept(first, 0, 1, EPOCH, 0, 11)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="now"):
        steps.reserve(first, 0, 1, EPOCH, -1)
    assert steps.complete(first, -1, 1 << 80) == -1  # matches no slot, as in Python


def test_steps_that_failed_to_initialise_refuse_to_run(steps: Steps) -> None:
    fresh = type(steps).__new__(type(steps))
    with pytest.raises(ValueError, match="resource area"):
        fresh.__init__(b"", 64, 64 + RESOURCE_SIZE + 1)  # type: ignore[misc]
    with pytest.raises(ValueError, match="initialised"):  # never a read through no mapping
        fresh.complete(64, 1, 1)
