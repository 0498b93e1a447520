"""Every storage method of ``shm://`` and ``async+shm://`` gives ``memory://``'s answers.

One script of calls runs on ``memory://`` and on the SHM storage (sync, and asyncio
through ``async+shm://``); counts and booleans must be equal, times (expiries, window
starts, ttls) equal within 50 ms.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

import limits
import pytest
from limits import strategies
from limits.storage import MemoryStorage, storage_from_string

from orbitive.limits import AsyncShmStorage, ShmStorage
from orbitive.limits._layout import RATE_KIND
from orbitive.limits._table import RateTable

from .._fleets import shm_path

#: (method, arguments) in order; every answer is compared.
SCRIPT: list[tuple[str, tuple[Any, ...]]] = [
    ("check", ()),
    ("get", ("a",)),
    ("get_expiry", ("a",)),
    ("incr", ("a", 60)),
    ("incr", ("a", 60, 4)),
    ("get", ("a",)),
    ("get_expiry", ("a",)),
    ("incr", ("b", 30.5, 2)),
    ("clear", ("a",)),
    ("get", ("a",)),
    ("incr", ("a", 60)),
    ("acquire_entry", ("w", 5, 60)),
    ("acquire_entry", ("w", 5, 60, 3)),
    ("acquire_entry", ("w", 5, 60, 2)),
    ("acquire_entry", ("w", 5, 60)),
    ("get_moving_window", ("w", 5, 60)),
    ("acquire_entry", ("w2", 3, 60, 4)),
    ("get_moving_window", ("w2", 3, 60)),
    ("acquire_entry", ("w2", 3, 60, 3)),
    ("get_moving_window", ("w2", 3, 60)),
    ("get", ("w",)),
    ("acquire_sliding_window_entry", ("s", 4, 60)),
    ("acquire_sliding_window_entry", ("s", 4, 60, 3)),
    ("acquire_sliding_window_entry", ("s", 4, 60)),
    ("get_sliding_window", ("s", 60)),
    ("acquire_sliding_window_entry", ("s2", 2, 60, 3)),
    ("clear_sliding_window", ("s", 60)),
    ("get_sliding_window", ("s", 60)),
    ("acquire_sliding_window_entry", ("s", 4, 60, 4)),
    ("clear", ("w",)),
    ("get_moving_window", ("w", 5, 60)),
    ("acquire_entry", ("w", 5, 60, 5)),
    ("reset", ()),
    ("get", ("b",)),
    ("get_moving_window", ("w", 5, 60)),
]


def _same(ours: object, theirs: object) -> bool:
    if isinstance(ours, tuple) and isinstance(theirs, tuple):
        return len(ours) == len(theirs) and all(map(_same, ours, theirs))
    if isinstance(ours, float) or isinstance(theirs, float):
        return abs(float(ours) - float(theirs)) < 0.05  # type: ignore[arg-type]
    return ours == theirs and type(ours) is type(theirs)


def _answers(call: Callable[[str, tuple[Any, ...]], object]) -> list[object]:
    return [call(name, args) for name, args in SCRIPT]


def _memory_answers() -> list[object]:
    memory = MemoryStorage()
    try:
        return _answers(lambda name, args: getattr(memory, name)(*args))
    finally:
        memory.timer.cancel()


def _compare(ours: list[object], theirs: list[object]) -> None:
    for (name, args), mine, expected in zip(SCRIPT, ours, theirs, strict=True):
        assert _same(mine, expected), f"{name}{args}: shm:// {mine!r}, memory:// {expected!r}"


def test_the_sync_storage_answers_as_memory_does(url: str) -> None:
    storage = _sync(url)
    assert isinstance(storage, ShmStorage)
    _compare(_answers(lambda name, args: getattr(storage, name)(*args)), _memory_answers())


def test_the_async_storage_answers_as_memory_does(url: str) -> None:
    storage = storage_from_string("async+" + url)
    assert isinstance(storage, AsyncShmStorage)

    async def run() -> list[object]:
        answers = []
        for name, args in SCRIPT:
            answer = getattr(storage, name)(*args)
            assert inspect.iscoroutine(answer), name
            answers.append(await answer)
        return answers

    _compare(asyncio.run(run()), _memory_answers())


def test_sync_and_async_storages_of_one_url_share_the_counts(url: str) -> None:
    sync = _sync(url)
    asynchronous = storage_from_string("async+" + url)
    assert isinstance(asynchronous, AsyncShmStorage)
    sync.incr("k", 60, 2)
    assert asyncio.run(asynchronous.incr("k", 60)) == 3
    assert sync.get("k") == 3


def _sync(url: str) -> ShmStorage:
    storage = storage_from_string(url)
    assert isinstance(storage, ShmStorage)
    return storage


@pytest.mark.parametrize(
    "limiter",
    [strategies.FixedWindowRateLimiter, strategies.MovingWindowRateLimiter,
     strategies.SlidingWindowCounterRateLimiter],
)  # fmt: skip
def test_each_strategy_admits_the_limit_then_refuses(url: str, limiter: type[Any]) -> None:
    item = limits.parse("5/minute")
    on_shm, on_memory = limiter(storage_from_string(url)), limiter(MemoryStorage())
    try:
        for _ in range(8):
            assert on_shm.hit(item, "x") is on_memory.hit(item, "x")
        assert on_shm.get_window_stats(item, "x").remaining == 0
        on_shm.clear(item, "x")
        assert on_shm.hit(item, "x")
    finally:
        on_memory.storage.timer.cancel()


def test_counters_and_windows_expire(url: str) -> None:
    storage = _sync(url)
    storage.incr("c", 0.2)
    assert storage.acquire_entry("m", 1, 0.2)
    assert not storage.acquire_entry("m", 1, 0.2)
    time.sleep(0.3)
    assert storage.get("c") == 0
    assert storage.get_moving_window("m", 1, 0.2)[1] == 0
    assert storage.acquire_entry("m", 1, 0.2)
    assert storage.incr("c", 60) == 1


def test_expired_entries_are_reused_so_a_full_neighbourhood_frees_itself(fleet: str) -> None:
    storage = _sync(f"shm://{fleet}?capacity=4&windows=2&window=4")
    for key in "abcd":
        storage.incr(key, 0.2)
    for key in "pq":
        storage.acquire_entry(key, 2, 0.2)
    time.sleep(0.3)
    for key in "efgh":
        assert storage.incr(key, 60) == 1
    for key in "rs":
        assert storage.acquire_entry(key, 2, 60)


def test_keys_of_any_length_and_any_text_are_counted_apart(url: str) -> None:
    storage = _sync(url)
    long_key = "k" * 100_000
    keys = [long_key, long_key + "x", "", "\udc80 lone surrogate", "ключ"]
    for count, key in enumerate(keys, 1):
        assert storage.incr(key, 60, count) == count
    assert [storage.get(key) for key in keys] == list(range(1, len(keys) + 1))


def test_the_table_has_the_bytes_the_url_sizes_it_for(fleet: str) -> None:
    storage = _sync(f"shm://{fleet}")
    table: RateTable = storage.table
    assert (table.geometry.capacity, table.geometry.windows, table.geometry.window) == (
        1024,
        256,
        128,
    )
    assert table.geometry.size == 128 + 1024 * 32 + 256 * (32 + 8 * 128) == 303_232
    assert shm_path(fleet, RATE_KIND).stat().st_size == 307_200 + 4096
