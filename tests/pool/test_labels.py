"""A pool key's label, limits and wait counters live in its slot: every process reads them."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import cast

import pytest

from orbitive import Fleet
from orbitive.pool import Key, KeyStatistics, MalformedError, Pool
from orbitive.pool._availability import add_waiter
from orbitive.pool._layout import LABEL_MAX
from orbitive.pool._stats import WAIT_BOUNDS_S


def _orbit_pool_json(fleet_name: str) -> dict[str, object]:
    """``orbit pool FLEET --json`` run by another process, parsed."""
    done = subprocess.run(
        [sys.executable, "-m", "orbitive", "pool", fleet_name, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    parsed: dict[str, object] = json.loads(done.stdout)
    return parsed


def test_the_last_label_counts_and_another_process_reads_it(
    shm_pool: Pool, fleet_name: str
) -> None:
    key = Key.digest(b"postgresql://app:secret@db:5432/main")
    shm_pool.label_key(key, "a much longer label than the one that follows it")
    shm_pool.label_key(key, "app@db:5432/main")
    unlabelled = Key(7)
    shm_pool.budget(unlabelled)  # installed, never labelled
    (row,) = [k for k in shm_pool.statistics().keys if k.key == key]
    assert (row.label, row.name) == ("app@db:5432/main", "app@db:5432/main")
    (bare,) = [k for k in shm_pool.statistics().keys if k.key == unlabelled]
    assert (bare.label, bare.name) == ("", str(unlabelled))
    rows = cast(list[dict[str, object]], _orbit_pool_json(fleet_name)["keys"])
    keys = {row["key"]: row for row in rows}
    assert keys[str(key)]["label"] == "app@db:5432/main"
    assert keys[str(unlabelled)]["label"] is None


def _row(pool: Pool, key: Key) -> KeyStatistics:
    (row,) = [k for k in pool.statistics().keys if k.key == key]
    return row


def test_reset_all_empties_the_label_and_the_limits(pool: Pool) -> None:
    key = Key(1)
    pool.label_key(key, "first")
    pool._t().describe(key, b"", (8, 1, 4))  # limits only: the label stays
    row = _row(pool, key)
    assert (row.label, row.max_live, row.min_idle, row.max_idle) == ("first", 8, 1, 4)
    pool.reset_all()
    pool.label_key(key, "second")
    row = _row(pool, key)
    assert (row.label, row.max_live, row.min_idle, row.max_idle) == ("second", 0, 0, 0)


@pytest.mark.parametrize(
    "label",
    ["", "x" * (LABEL_MAX + 1), "é" * 64, "line\nbreak", "del\x7f", "c1\x85", "\ud800", b"raw", 3],
)
def test_a_bad_label_is_a_malformed_error_and_writes_nothing(pool: Pool, label: object) -> None:
    key = Key(2)
    pool.label_key(key, "good")
    with pytest.raises(MalformedError):
        pool.label_key(key, label)  # type: ignore[arg-type]
    assert _row(pool, key).label == "good"


def test_a_label_of_127_bytes_is_kept_whole(pool: Pool) -> None:
    label = "ü" * 63 + "x"  # 127 bytes of UTF-8
    pool.label_key(Key(3), label)
    assert _row(pool, Key(3)).label == label


def test_waits_are_counted_by_bucket_and_timeouts_apart(pool: Pool) -> None:
    key = Key(4)
    table = pool._t()
    outcomes = [(us, False) for us in (500, 1_000, 1_001, 7_000_000, 60_000_000)]
    for outcome in [*outcomes, (0, True), (0, True), None]:  # None: interrupted, not counted
        add_waiter(table, key, 1)
        add_waiter(table, key, -1, outcome)
    (row,) = [k for k in pool.statistics().keys if k.key == key]
    assert (row.timeouts_count, row.waits_count) == (2, 5)
    assert row.waited_s == pytest.approx(67.002501)
    by_bound = dict(zip(WAIT_BOUNDS_S, row.wait_buckets, strict=True))
    assert by_bound == {0.001: 2, 0.005: 1, 0.01: 0, 0.05: 0, 0.1: 0, 0.5: 0, 1.0: 0, 5.0: 0,
                        10.0: 1}  # fmt: skip
    assert sum(row.wait_buckets) == 4  # the 60 s wait is counted in waits only


def test_orbit_pool_totals_say_waiting_for_callers_and_parked_for_sleepers(
    shm_fleet: Fleet, fleet_name: str
) -> None:
    with Pool(shm_fleet) as pool:
        key = Key(5)
        table = pool._t()
        index = table.index(key)
        table.park(index, table.changes(index))  # a thread asleep on the key: not a caller
        try:
            parsed = _orbit_pool_json(fleet_name)
        finally:
            table.unpark(index)
    totals = cast(dict[str, int], parsed["totals"])
    assert (totals["waiting"], totals["parked"]) == (0, 1)
    (row,) = cast(list[dict[str, int]], parsed["keys"])
    assert (row["waiting"], row["parked_nodes"]) == (0, 1)
