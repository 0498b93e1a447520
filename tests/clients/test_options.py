"""PoolOptions and ClientPool arguments: bad values are named errors, raised before any claim."""

from __future__ import annotations

import math
import pickle
from typing import Any

import pytest

from orbitive import Fleet, OrbitError
from orbitive.clients import (
    ClientCreateError,
    ClientPool,
    InvalidPoolOptions,
    PoolClosed,
    PoolOptions,
    PoolTimeout,
    TooManyRequests,
    UnknownClient,
)
from orbitive.pool import Key


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_live": 0},
        {"max_live": -1},
        {"max_live": True},
        {"max_live": 2.0},
        {"max_live": 2**40},
        {"min_idle": -1},
        {"min_idle": 3, "max_idle": 2},
        {"max_idle": 5, "max_live": 4},
        {"max_waiting": 0},
        {"acquire_timeout": 0.0},
        {"acquire_timeout": -1.0},
        {"acquire_timeout": math.nan},
        {"idle_timeout": math.inf},
        {"max_lifetime": "10"},
        {"max_lifetime": 10**400},
        {"idle_timeout": False},
        {"handoff_after": 0.0},
        {"handoff_after": math.inf},
        {"handoff_after": "0.1"},
        {"handoff_uses": 0},
        {"handoff_uses": 1.5},
    ],
    ids=repr,
)
def test_bad_options_raise_invalid_pool_options_naming_the_field(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidPoolOptions) as caught:
        PoolOptions(**kwargs)
    assert isinstance(caught.value, ValueError)
    assert caught.value.key in kwargs or caught.value.key == "max_idle"


def test_defaults_and_max_idle_defaulting_to_max_live() -> None:
    options = PoolOptions(max_live=7)
    assert (options.max_idle, options.min_idle, options.max_waiting) == (7, 0, 1024)
    assert options.acquire_timeout == 30.0
    assert type(PoolOptions(acquire_timeout=5).acquire_timeout) is float
    assert PoolOptions(max_live=3, min_idle=1, max_idle=1).idle_limit == 1
    assert (options.handoff_after, options.handoff_uses) == (0.5, None)  # a turn is a time


def test_bad_pool_arguments_raise_before_the_table_is_touched(fleet: Fleet) -> None:
    def ok() -> object:
        return object()

    with pytest.raises(InvalidPoolOptions):
        ClientPool(fleet, "k", create=42, close=print)  # type: ignore[arg-type]  # under test
    with pytest.raises(InvalidPoolOptions):
        ClientPool(fleet, "k", create=ok, close=None)  # type: ignore[arg-type]  # under test
    with pytest.raises(InvalidPoolOptions):
        ClientPool(fleet, "k", create=ok, close=print, check=3)  # type: ignore[arg-type]
    with pytest.raises(InvalidPoolOptions):
        ClientPool(fleet, b"", create=ok, close=print)
    with pytest.raises(InvalidPoolOptions):
        ClientPool(fleet, 12, create=ok, close=print)
    with pytest.raises(InvalidPoolOptions):
        ClientPool(fleet, "k", create=ok, close=print, options={"max_live": 2})  # type: ignore[arg-type]
    with (
        ClientPool(fleet, Key.digest(b"k"), create=ok, close=print) as pool,
        ClientPool(fleet, "k", create=ok, close=print) as same,
    ):
        assert pool.key == same.key
        stats = pool.statistics()
        assert (stats.live, stats.creating, stats.waiting) == (0, 0, 0)


@pytest.mark.parametrize(
    "cls, builtin",
    [
        (InvalidPoolOptions, ValueError),
        (InvalidPoolOptions, TypeError),
        (UnknownClient, ValueError),
        (PoolTimeout, TimeoutError),
        (PoolClosed, OrbitError),
        (TooManyRequests, OrbitError),
        (ClientCreateError, OrbitError),
    ],
)
def test_client_errors_are_orbit_errors_with_their_builtin_and_pickle(
    cls: type[OrbitError], builtin: type[BaseException]
) -> None:
    error = cls("client pool of key 1f: 4 of 4 in use", key="k")
    assert isinstance(error, OrbitError)
    assert isinstance(error, builtin)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is cls
    assert (again.message, again.key) == (error.message, "k")
    assert cls.__module__ == "orbitive.clients"
