"""The stripes of the lock table's section: steps on keys far apart hold different mutexes.

A table of 64 slots has 32 stripes of 2 slots. The keys here have their homes on
the last slot of a stripe or of the table, so their probe chains cross stripe
edges and wrap: the C steps then hold more than one stripe, extend what they
hold, or take every stripe. The C and Python steps must still agree byte for
byte, and processes on both kinds of step, two threads each, must never hold a
key twice or see a fencing token that did not grow.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbitive import Fleet, LayoutMismatch
from orbitive._core._region import Region
from orbitive._core._section import BLOCK, ROBUST_MUTEX
from orbitive.lock import LockKey, LockLayout, LockTable
from orbitive.lock._layout import MAX_PROBE_OFFSET

from .._capabilities import require_c_steps
from .._children import STRIPE_WITNESS, stripe_churn
from .._processes import Processes
from .test_fastpath import run_both, tables

EDGE = LockLayout(
    state_kind=142, event_kind=143, capacity=64, payload_max=48, ring_capacity=256, frame_bytes=96
)
SLOTS_PER_STRIPE = EDGE.capacity // EDGE.stripes


def _edge_keys(count: int, prefix: str) -> list[LockKey]:
    """Keys whose home is the last slot of a stripe, a quarter of them the table's last."""
    found: list[LockKey] = []
    for n in range(100_000):
        key = LockKey("tests.stripes", f"{prefix}-{n}")
        home = key.digest & (EDGE.capacity - 1)
        last = home == EDGE.capacity - 1
        if home % SLOTS_PER_STRIPE == SLOTS_PER_STRIPE - 1 and (last or len(found) % 4):
            found.append(key)
            if len(found) == count:
                return found
    raise AssertionError("too few edge keys")


EDGE_KEYS = _edge_keys(24, "edge")
EXPIRING = _edge_keys(8, "expiring")


@pytest.fixture
def edge_pair() -> Iterator[tuple[LockTable, LockTable]]:
    yield from tables(EDGE)


def test_the_state_section_records_the_layouts_stripes(edge_pair: tuple[LockTable, ...]) -> None:
    table = edge_pair[0]
    assert table.layout.stripes == 32 and LockLayout(capacity=8).stripes == 8
    section = table._state.section
    assert section is not None and section.mechanism == ROBUST_MUTEX
    assert section.stripes == BLOCK.unpack(table._state.block[: BLOCK.size])[5] == 32


def test_a_region_attached_with_another_stripe_count_is_layout_mismatch(fleet_name: str) -> None:
    def attach(stripes: int) -> Region:
        return Region.open_shared(fleet_name, 77, 64, lambda buf: None, lambda buf: None, stripes)

    region = attach(4)
    with pytest.raises(LayoutMismatch, match="4 stripes"):
        attach(2)
    attach(4).close()
    region.close()
    region.unlink()
    with pytest.raises(ValueError, match="stripes"):
        attach(64)  # more than a section block holds


@pytest.mark.parametrize("seed", range(4))
def test_c_and_python_steps_agree_across_stripe_edges_and_the_wrap(
    edge_pair: tuple[LockTable, LockTable], seed: int
) -> None:
    require_c_steps(edge_pair[0]._steps, "orbitive.lock._fastpath")
    run_both(edge_pair, seed, EDGE_KEYS + EXPIRING, 600)
    bound = int.from_bytes(edge_pair[0]._buf[MAX_PROBE_OFFSET : MAX_PROBE_OFFSET + 4], "little")
    assert bound >= SLOTS_PER_STRIPE  # chains ran past a whole stripe


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_processes_on_both_kinds_of_step_hold_each_key_once_across_stripe_edges(
    fleet_name: str, start: str, tmp_path: Path
) -> None:
    breach_at = STRIPE_WITNESS.size * len(EDGE_KEYS)
    path = tmp_path / "witness"
    path.write_bytes(bytes(breach_at + 8))
    with path.open("r+b") as file:
        witness = mmap.mmap(file.fileno(), 0)
    with Fleet.join(fleet_name, 8) as fleet, Processes(start) as processes:
        table = LockTable(fleet, EDGE)
        churners = [
            processes.start(
                stripe_churn, fleet_name, EDGE, EDGE_KEYS, EXPIRING, str(path), n % 2 == 1, 1.5
            )
            for n in range(4)
        ]
        replies = [churner.recv(timeout=60.0) for churner in churners]
        assert [errors for _, errors in replies] == [[]] * 4
        counts = [count for count, _ in replies]
        breach = int.from_bytes(witness[breach_at:], "little")
        assert breach == 0, {1: "two holders", 2: "token not grown", 3: "renew", 4: "release"}
        assert all(count > 0 for pair in counts for count in pair), counts
        live = {lease.key for lease in table.leases()}
        assert not live & set(EDGE_KEYS), "every tracked key was released"
        statistics = table.statistics()
        assert statistics.max_probe < EDGE.capacity
        assert statistics.last_fencing_token >= sum(map(sum, counts))  # none taken twice
        for key in EDGE_KEYS:  # every chain still leads to its key
            assert table.current(key) is None
        table.close()
