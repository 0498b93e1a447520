"""The C steps (``_fastpath.c``) and their Python twin (``_table.RateTable``) agree.

One random script of increments and moving-window acquires (new keys, live keys, full
windows, several amounts and limits) runs on two tables of one geometry: one whose
hot steps run in C, one with the C steps switched off. Every answer and every
counter and window (value, head, count) must be equal; and the layout constants the
C module states must equal the Python ones.
"""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Iterator

import pytest

from orbitive import Fleet
from orbitive.limits import _layout, _table
from orbitive.limits._layout import Geometry
from orbitive.limits._table import RateTable

from .._fleets import new_fleet_name, remove_fleet_files
from .._structs import fields

try:
    from orbitive.limits import _fastpath
except ImportError:  # pragma: no cover - built without a C compiler
    _fastpath = None  # type: ignore[assignment]

needs_c = pytest.mark.skipif(_fastpath is None, reason="orbitive.limits._fastpath was not built")
GEOMETRY = Geometry(capacity=32, windows=32, window=16)


@needs_c
def test_every_c_layout_constant_equals_its_python_twin() -> None:
    entry = [offset for offset, _ in fields(_layout.ENTRY)]
    slot = [offset for offset, _ in fields(_layout.SLOT_HEAD)]
    assert _fastpath is not None
    assert {
        "JOURNAL_AT": _layout.JOURNAL_AT,
        "ENTRIES_AT": _layout.ENTRIES_AT,
        "ENTRY_SIZE": _layout.ENTRY_SIZE,
        "SLOT_HEAD_SIZE": _layout.SLOT_HEAD_SIZE,
        "EXPIRES_AT": entry[2] == slot[2] and entry[2],
        "VALUE_AT": entry[3],
        "HEAD_AT": slot[3],
        "COUNT_AT": slot[4],
        "VALUE_MAX": _table.VALUE_MAX,
        "EXPIRES_MAX": int(_table.EXPIRES_MAX),
    } == _fastpath.LAYOUT


def _state(table: RateTable) -> list[tuple[int, ...]]:
    """Every entry's (digest, value) and every slot's (digest, head, count), times left out."""
    buf = table.buf
    found: list[tuple[int, ...]] = []
    for at in range(_layout.ENTRIES_AT, table.geometry.windows_at, _layout.ENTRY_SIZE):
        lo, hi, _, value = _layout.ENTRY.unpack_from(buf, at)
        found.append((lo, hi, value))
    for index in range(table.geometry.windows):
        lo, hi, _, head, count = _layout.SLOT_HEAD.unpack_from(
            buf, table.geometry.windows_at + table.geometry.slot_size * index
        )
        found.append((lo, hi, head, count))
    return found


@pytest.fixture
def other_fleet() -> Iterator[str]:
    """A second fleet name of this test only, removed afterwards."""
    name = new_fleet_name()
    yield name
    remove_fleet_files(name)


@pytest.fixture
def twin_tables(fleet: str, other_fleet: str) -> Iterator[tuple[RateTable, RateTable]]:
    """(a table of ``fleet`` on the C steps, one of ``other_fleet`` on the Python steps),
    both of :data:`GEOMETRY`, closed afterwards."""
    with Fleet.join(fleet) as on_c, Fleet.join(other_fleet) as on_python:
        c_table, python_table = RateTable(on_c, GEOMETRY), RateTable(on_python, GEOMETRY)
        assert c_table.steps is not None
        python_table.steps = None
        yield c_table, python_table
        c_table.close()
        python_table.close()


@needs_c
def test_the_c_steps_and_the_python_steps_give_the_same_answers_and_bytes(
    twin_tables: tuple[RateTable, RateTable],
) -> None:
    rng = random.Random(33)
    c_table, python_table = twin_tables
    calls = {"incr": 0, "acquire": 0}
    for _ in range(3000):
        key = f"key-{rng.randrange(20)}"
        if rng.random() < 0.5:
            amount = rng.choice((1, 1, 2, 5, 2**61))
            answers = [table.incr(key, 60.0, amount) for table in (c_table, python_table)]
            calls["incr"] += 1
        else:
            limit = rng.randrange(1, GEOMETRY.window + 1)
            amount = rng.randrange(1, limit + 1)
            answers = [
                table.acquire_entry(key, limit, 60.0, amount) for table in (c_table, python_table)
            ]
            calls["acquire"] += 1
        assert answers[0] == answers[1], (key, answers)
        assert type(answers[0]) is type(answers[1])
    assert _state(c_table) == _state(python_table)
    assert [c_table.get_moving_window(f"key-{k}", 60.0)[1] for k in range(20)] == [
        python_table.get_moving_window(f"key-{k}", 60.0)[1] for k in range(20)
    ]
    assert min(calls.values()) > 1000


@needs_c
def test_the_c_steps_decline_an_armed_journal_and_python_rolls_it_back(fleet: str) -> None:
    with Fleet.join(fleet) as joined:
        table = RateTable(joined, GEOMETRY)
        assert table.incr("k", 60.0, 1) == 1
        at = _layout.ENTRIES_AT + _layout.ENTRY_SIZE * (_table.counter_digest("k")[0] % 32)
        # A writer that died inside a step: its journal saved this entry as it was.
        table.buf[_layout.SAVED_AT : _layout.SAVED_AT + 32] = table.buf[at : at + 32]
        table.buf[at + 24 : at + 32] = struct.pack("<q", 99)
        table.buf[_layout.JOURNAL_AT : _layout.JOURNAL_AT + 8] = struct.pack("<Q", at | 32 << 32)
        assert (
            table.steps is not None
            and table.steps.incr(*_table.counter_digest("k"), 60.0, 1) is None
        )
        assert table.incr("k", 60.0, 1) == 2
        assert table.rollbacks() == 1
        table.close()


@needs_c
def test_the_c_and_python_sliding_window_steps_agree_at_any_time(
    twin_tables: tuple[RateTable, RateTable],
) -> None:
    rng = random.Random(34)
    c_table, python_table = twin_tables
    steps = c_table.steps
    assert steps is not None
    for table in (c_table, python_table):
        for number in range(8):
            table.incr(f"w{number}", 3600.0, number * 3)
    now = time.time()
    answers = []
    for _ in range(2000):
        previous, current = rng.sample([f"w{number}" for number in range(10)], 2)
        limit = rng.randrange(1, 60)
        amount = rng.randrange(1, limit + 1)
        expiry = rng.choice((1.0, 7.5, 60.0))
        now += rng.uniform(0, 0.1)  # time runs forward: a dead entry stays dead
        from_c = steps.sliding(*_table.counter_digest(previous), *_table.counter_digest(current),
                               limit, expiry, amount, now)  # fmt: skip
        with python_table.region:
            from_python = python_table._sliding_step(previous, current, limit, expiry,
                                                      amount, now)  # fmt: skip
        if from_c is None:  # a new current counter: the Python step writes it, in both
            with c_table.region:
                from_c = c_table._sliding_step(previous, current, limit, expiry, amount, now)
        answers.append(from_c)
        assert from_c is from_python, (previous, current, limit, amount, expiry, now)
    assert _state(c_table) == _state(python_table)
    assert True in answers and False in answers
