"""Fixtures of the orbitive.celery tests: an eager Celery app over a store (unit tests),
and the store URLs a real worker uses (``test_worker.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from orbitive import celery as orbit_celery

from ..store.conftest import postgres_url, redis_url, shm_url, sqlite_url

__all__ = ["postgres_url", "redis_url", "shm_url", "sqlite_url"]  # fixtures, reused

MakeApp = Callable[..., Celery]


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A SQLite store of this test only."""
    return f"sqlite://{tmp_path}/locks.db"


@pytest.fixture(autouse=True)
def _close_stores() -> Iterator[None]:
    """Close the stores orbitive.celery opened in this process during the test."""
    yield
    with orbit_celery._stores_mutex:
        stores = list(orbit_celery._stores.values())
        orbit_celery._stores.clear()
    for store in stores:
        store.close()


@pytest.fixture
def make_app(store_url: str) -> MakeApp:
    """Builds an eager Celery app (no broker is reached) whose store is ``store_url``."""

    def make(**conf: Any) -> Celery:
        app = Celery("unit", set_as_current=False)
        settings = {"task_always_eager": True, "task_eager_propagates": True}
        app.conf.update({**settings, "orbitive_store_url": store_url, **conf})
        return app

    return make


@pytest.fixture(params=["sqlite", "shm", "postgres", "redis"])
def engine_url(request: pytest.FixtureRequest) -> str:
    """A fresh store URL on each engine (the fixtures of tests/store/conftest.py)."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url
