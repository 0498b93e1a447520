"""Fixtures of the ``postgresql://`` storage tests: a fresh schema of the session's
PostgreSQL server, and each storage form (sync, asyncio) behind one sync interface.

Test modules import the fixtures they use from here (no conftest: the directory's
other storages keep theirs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import pytest

from orbitive.limits import AsyncPostgresStorage, PostgresStorage

from .._servers import TempPostgres

FORMS = ("sync", "async")
_T = TypeVar("_T")


class Blocking:
    """The asyncio storage's calls, each run to its end on an event loop of its own, so a
    test drives both forms alike."""

    def __init__(self, storage: AsyncPostgresStorage) -> None:
        self.storage = storage
        self._loop = asyncio.new_event_loop()

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.storage, name)
        if not asyncio.iscoroutinefunction(method):
            return method
        return lambda *args, **kwargs: self._loop.run_until_complete(method(*args, **kwargs))

    def run(self, awaitable: Awaitable[_T]) -> _T:
        """Run ``awaitable`` to its end on this adapter's loop."""
        return self._loop.run_until_complete(awaitable)

    def close(self) -> None:
        self.storage.close()
        self._loop.close()


def open_form(form: str, url: str, **options: Any) -> Any:
    """A storage of ``form`` ("sync" or "async") on ``url`` (a ``postgresql://`` URL)."""
    if form == "sync":
        return PostgresStorage(url, **options)
    return Blocking(AsyncPostgresStorage("async+" + url, **options))


@pytest.fixture
def pg_url(postgres_server: TempPostgres) -> Iterator[str]:
    """A ``postgresql://`` URL whose ``search_path`` is a fresh schema, dropped afterwards."""
    with postgres_server.schema_url("l_") as url:
        yield url


@pytest.fixture(params=FORMS)
def form(request: pytest.FixtureRequest) -> str:
    """Each storage form: "sync" and "async"."""
    chosen: str = request.param
    return chosen


@pytest.fixture
def storage(form: str, pg_url: str) -> Iterator[Any]:
    """A storage of each form on a fresh schema, closed afterwards."""
    opened = open_form(form, pg_url)
    yield opened
    opened.close()
