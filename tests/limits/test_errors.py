"""Bad input to the ``shm://`` storage: each case raises its named error, saying what to change."""

from __future__ import annotations

import asyncio
import math
import pickle
from typing import Any

import pytest
from limits.errors import StorageError
from limits.storage import storage_from_string

import orbitive.limits
from orbitive import LayoutMismatch, OrbitError
from orbitive.limits import (
    InvalidRateAmount,
    InvalidRateExpiry,
    InvalidRateKey,
    InvalidRateStorageUrl,
    RateTableFull,
    ShmStorage,
    WindowTooLarge,
)


def _sync(url: str) -> ShmStorage:
    storage = storage_from_string(url)
    assert isinstance(storage, ShmStorage)
    return storage


@pytest.mark.parametrize(
    ("tail", "says"),
    [
        ("", "fleet name"),
        ("web/path", "only a fleet name"),
        ("web#frag", "only a fleet name"),
        ("user@web", "only a fleet name"),
        ("web:80", "only a fleet name"),
        ("bad name!", "fleet name"),
        ("web?size=3", "unknown option 'size'"),
        ("web?capacity=0", "capacity='0' must be an integer from 1 to 1048576"),
        ("web?capacity=-4", "capacity='-4' must be an integer"),
        ("web?windows=1.5", "windows='1.5' must be an integer from 1 to 65536"),
        ("web?window=65537", "window='65537' must be an integer from 1 to 65536"),
        ("web?window=", "window='' must be an integer"),
        ("web?capacity=8&capacity=8", "given twice"),
        ("web?capacity", "NAME=VALUE"),
        ("web?windows=65536&window=65536", "more than 1,073,741,824"),
    ],
)
def test_a_bad_url_names_what_to_change(tail: str, says: str) -> None:
    with pytest.raises(InvalidRateStorageUrl, match=None) as raised:
        storage_from_string("shm://" + tail)
    assert says in str(raised.value)
    assert isinstance(raised.value, ValueError)


def test_a_keyword_option_or_another_scheme_is_refused(fleet: str) -> None:
    with pytest.raises(InvalidRateStorageUrl, match="no keyword options, got capacity"):
        storage_from_string(f"shm://{fleet}", capacity=5)
    with pytest.raises(InvalidRateStorageUrl, match="must be a str"):
        orbitive.limits.ShmStorage(7)  # type: ignore[arg-type]
    with pytest.raises(InvalidRateStorageUrl, match="expected shm://FLEET"):
        orbitive.limits.ShmStorage(f"memory://{fleet}")


def test_another_geometry_for_the_same_fleet_is_a_layout_mismatch(fleet: str) -> None:
    storage_from_string(f"shm://{fleet}?capacity=64")
    orbitive.limits._shm_storage._tables.clear()  # as another process would, without its cache
    with pytest.raises(
        LayoutMismatch, match="capacity=64, windows=16, window=128; this URL asks for capacity=128"
    ):
        storage_from_string(f"shm://{fleet}?capacity=128")


BAD_CALLS: list[tuple[str, tuple[Any, ...], type[OrbitError], str]] = [
    ("incr", (b"k", 60), InvalidRateKey, "must be a str, got bytes"),
    ("get", (None,), InvalidRateKey, "must be a str"),
    ("get_expiry", (3,), InvalidRateKey, "must be a str"),
    ("clear", (["k"],), InvalidRateKey, "must be a str"),
    ("incr", ("k", 60, 0), InvalidRateAmount, "amount must be an int of at least 1, got 0"),
    ("incr", ("k", 60, True), InvalidRateAmount, "amount must be an int"),
    ("incr", ("k", 60, 1.0), InvalidRateAmount, "amount must be an int"),
    ("incr", ("k", 0), InvalidRateExpiry, "finite number of seconds above 0, got 0"),
    ("incr", ("k", math.nan), InvalidRateExpiry, "got nan"),
    ("incr", ("k", math.inf), InvalidRateExpiry, "got inf"),
    ("incr", ("k", "60"), InvalidRateExpiry, "got '60'"),
    ("acquire_entry", ("k", -1, 60), InvalidRateAmount, "limit must be an int of at least 0"),
    ("acquire_entry", ("k", 17, 60), WindowTooLarge, "give the storage URL window=17 or more"),
    ("get_moving_window", ("k", 17, 60), WindowTooLarge, "above the 16 timestamps"),
    ("acquire_entry", ("k", 4, 60, -2), InvalidRateAmount, "amount must be an int"),
    ("acquire_sliding_window_entry", ("k", 4, -1), InvalidRateExpiry, "above 0"),
    ("acquire_sliding_window_entry", (1, 4, 60), InvalidRateKey, "must be a str"),
    ("get_sliding_window", ("k", None), InvalidRateExpiry, "above 0"),
    ("clear_sliding_window", ("k", 0), InvalidRateExpiry, "above 0"),
]


@pytest.mark.parametrize(("method", "args", "error", "says"), BAD_CALLS)
def test_a_bad_argument_raises_its_named_error_sync_and_async(
    url: str, method: str, args: tuple[Any, ...], error: type[OrbitError], says: str
) -> None:
    sync, asynchronous = storage_from_string(url), storage_from_string("async+" + url)
    with pytest.raises(error) as raised:
        getattr(sync, method)(*args)
    assert says in str(raised.value)
    with pytest.raises(error):
        asyncio.run(getattr(asynchronous, method)(*args))
    # A caller's mistake is never wrapped as the storage failing.
    sync.wrap_exceptions = True
    with pytest.raises(error):
        getattr(sync, method)(*args)


def test_a_full_table_raises_rate_table_full_and_counts_nothing(fleet: str) -> None:
    storage = _sync(f"shm://{fleet}?capacity=4&windows=2&window=4")
    for key in "abcd":
        storage.incr(key, 60)
    with pytest.raises(RateTableFull, match=r"capacity=4\).*Raise capacity in the storage URL"):
        storage.incr("e", 60)
    assert storage.get("e") == 0
    storage.acquire_entry("p", 2, 60)
    storage.acquire_entry("q", 2, 60)
    with pytest.raises(RateTableFull, match=r"no free or expired moving-window slot.*windows=2"):
        storage.acquire_entry("r", 2, 60)
    assert storage.get_moving_window("r", 2, 60)[1] == 0
    # Keys already in the table go on being counted.
    assert storage.incr("a", 60) == 2
    storage.wrap_exceptions = True
    with pytest.raises(StorageError):
        storage.incr("e", 60)


def test_the_errors_are_orbit_errors_that_survive_pickling() -> None:
    for error in (InvalidRateAmount, InvalidRateExpiry, InvalidRateKey, InvalidRateStorageUrl,
                  RateTableFull, WindowTooLarge):  # fmt: skip
        raised = error("message", fleet="web", key="k")
        copy = pickle.loads(pickle.dumps(raised))
        assert isinstance(copy, OrbitError) and type(copy) is error
        assert (copy.message, copy.fleet, copy.key) == ("message", "web", "k")
