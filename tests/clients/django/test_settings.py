"""Bad ``OPTIONS["pool"]`` settings: ImproperlyConfigured when Django builds the connection.

Django builds a database's wrapper on the first ``connections[alias]``
(``manage.py check --database``, ``migrate``, the test runner, a worker's
first request), before any connection is opened: the settings point at a
port where nothing listens, so an attempt to connect would fail differently.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db.utils import ConnectionHandler

from orbitive.clients.django.base import DatabaseWrapper


def wrapper(pool: Any = None, missing: bool = False, **database: Any) -> Any:
    """``connections["default"]`` for a database that uses the engine (never connected)."""
    options = {} if missing else {"pool": pool}
    settings: dict[str, Any] = {"ENGINE": "orbitive.clients.django", "NAME": "app"}
    settings |= {"HOST": "127.0.0.1", "PORT": 9, "OPTIONS": options, **database}
    return ConnectionHandler({"default": settings})["default"]


#: A budget's arguments as OPTIONS["pool"]["budget"] gives them.
BUDGET = {"url": "postgresql://coord@127.0.0.1:9/app", "name": "main-db", "total": 4}

BAD_POOLS = [
    (True, "must be a dict with a 'fleet' name"),
    ("web", "must be a dict with a 'fleet' name"),
    ({}, "needs 'fleet'"),
    ({"max_live": 4}, "needs 'fleet'"),
    ({"fleet": "web", "min_size": 2}, "use min_idle"),
    ({"fleet": "web", "max_size": 8}, "use max_live"),
    ({"fleet": "web", "max_idle": 300.0}, "is idle_timeout here"),
    ({"fleet": "web", "num_workers": 3}, "connections are made by the process that asks"),
    ({"fleet": "web", "maxlive": 8}, "unknown key 'maxlive'; it takes fleet, fleet_capacity"),
    ({"fleet": "web/1"}, "fleet name must be 1..32 characters"),
    ({"fleet": ""}, "fleet name must be 1..32 characters"),
    ({"fleet": 7}, "fleet name must be 1..32 characters"),
    ({"fleet": "web", "fleet_capacity": 0}, "fleet capacity must be an int in 1..4096"),
    ({"fleet": "web", "max_live": 0}, "max_live must be an int in 1.."),
    ({"fleet": "web", "max_live": "8"}, "max_live must be an int in 1.."),
    ({"fleet": "web", "max_live": True}, "max_live must be an int in 1.."),
    ({"fleet": "web", "max_live": 4, "min_idle": 3, "max_idle": 2}, "min_idle <= max_idle"),
    ({"fleet": "web", "max_live": 4, "max_idle": 5}, "min_idle <= max_idle <= max_live"),
    ({"fleet": "web", "timeout": -1}, "timeout must be finite seconds"),
    ({"fleet": "web", "timeout": math.nan}, "timeout must be finite seconds"),
    ({"fleet": "web", "timeout": "10"}, "timeout must be seconds as a float"),
    ({"fleet": "web", "idle_timeout": math.inf}, "idle_timeout must be finite seconds"),
    ({"fleet": "web", "handoff_uses": 0}, "handoff_uses must be an int in 1.."),
    ({"fleet": "web", "budget": "main-db"}, "['budget'] must be a dict of Budget's arguments"),
    ({"fleet": "web", "budget": {"url": "postgresql://db/app", "name": "db"}}, "needs total"),
    ({"fleet": "web", "budget": {**BUDGET, "ttll": 5}}, "unknown key 'ttll'; it takes url"),
    ({"fleet": "web", "budget": {**BUDGET, "url": "sqlite:///x.db"}}, "PostgreSQL or Redis URL"),
    ({"fleet": "web", "budget": {**BUDGET, "total": 0}}, "budget total must be an int in 1.."),
    *[
        (
            {"fleet": "web", "budget": {**BUDGET, "url": f"{BUDGET['url']}?timeout={seconds}"}},
            f"timeout={seconds} must be seconds in 0.05..2.5",
        )
        for seconds in ("-1", "0", "0.01")
    ],
    ({"fleet": "web", "max_live": 8, "min_idle": 5, "budget": BUDGET}, "below the pool's min_idle"),
]


@pytest.mark.parametrize(("pool", "message"), BAD_POOLS, ids=[repr(p) for p, _ in BAD_POOLS])
def test_a_bad_pool_setting_is_improperly_configured(pool: Any, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=r"DATABASES\['default'\]") as raised:
        wrapper(pool)
    assert message in str(raised.value)


def test_a_missing_pool_setting_says_how_to_give_one_or_go_without() -> None:
    with pytest.raises(ImproperlyConfigured) as raised:
        wrapper(missing=True)
    assert "needs DATABASES['default']['OPTIONS']['pool']" in str(raised.value)
    assert "False opens every connection directly" in str(raised.value)


@pytest.mark.parametrize("age", [60, None])
def test_persistent_connections_are_refused_as_djangos_own_pool_refuses_them(age: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match="Pooling doesn't support persistent"):
        wrapper({"fleet": "web"}, CONN_MAX_AGE=age)


@pytest.mark.parametrize(
    "pool",
    [False, None, {"fleet": "web"}, {"fleet": "web", "timeout": 2},
     {"fleet": "web", "budget": {**BUDGET, "ttl": 5.0}}],
)  # fmt: skip
def test_good_settings_build_the_wrapper_without_connecting(pool: Any) -> None:
    built = wrapper(pool)
    assert isinstance(built, DatabaseWrapper)
    assert built.connection is None
