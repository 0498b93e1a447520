"""A pytest plugin that runs ``limits``' own storage and strategy tests on ``postgresql://``.

Loaded by ``test_postgres_upstream`` into a pytest run over the unpacked ``limits``
sdist (its ``tests/``, with ``--noconftest``: its conftest imports the clients of
servers this suite does not run), never into this suite. Their in-memory cases
(``-k in-memory``) build their storage as ``memory://`` (``async+memory://``) and
check it is a ``MemoryStorage``: both names lead here to the PostgreSQL storages of
the URL in ``ORBIT_UPSTREAM_PG_URL``, each new storage emptying the tables first, as
a new ``MemoryStorage`` starts empty. Their coroutine tests run under
``asyncio.run`` (no pytest-asyncio); a test marked ``flaky`` runs up to its
``max_runs`` (default 2) times, as upstream's flaky plugin runs it; and
``pytest_lazy_fixtures`` (their servers' fixtures, unused by the in-memory cases) is a
stub.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import sys
import types
from typing import Any

import limits.aio.storage
import limits.storage
import pytest

from orbitive.limits import AsyncPostgresStorage, PostgresStorage

URL = os.environ.get("ORBIT_UPSTREAM_PG_URL", "")


def _emptied() -> None:
    """Empty the tables of :data:`URL`, as a new ``MemoryStorage`` starts empty."""
    storage = PostgresStorage(URL)
    try:
        storage.reset()
    finally:
        storage.close()


class UpstreamPostgresStorage(PostgresStorage):
    """``memory://`` in the upstream run: the sync PostgreSQL storage, emptied when made."""

    STORAGE_SCHEME = ["memory"]  # noqa: RUF012 - limits reads a list

    def __init__(
        self, uri: str | None = None, wrap_exceptions: bool = False, **options: Any
    ) -> None:
        super().__init__(URL, wrap_exceptions)
        _emptied()


class UpstreamAsyncPostgresStorage(AsyncPostgresStorage):
    """``async+memory://`` in the upstream run: the asyncio PostgreSQL storage, emptied
    when made."""

    STORAGE_SCHEME = ["async+memory"]  # noqa: RUF012 - limits reads a list

    def __init__(
        self, uri: str | None = None, wrap_exceptions: bool = False, **options: Any
    ) -> None:
        super().__init__("async+" + URL, wrap_exceptions)
        _emptied()


limits.storage.MemoryStorage = UpstreamPostgresStorage  # type: ignore[misc, assignment]
limits.aio.storage.MemoryStorage = UpstreamAsyncPostgresStorage  # type: ignore[misc, assignment]
_lazy = types.ModuleType("pytest_lazy_fixtures")
_lazy.lf = lambda name: None  # type: ignore[attr-defined]
sys.modules.setdefault("pytest_lazy_fixtures", _lazy)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Take upstream's ``asyncio_mode`` setting (pytest-asyncio's), which this run does not need."""
    parser.addini(
        "asyncio_mode", "pytest-asyncio's mode (unused: coroutines run under asyncio.run)"
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the marks of upstream's plugins (flaky, pytest-asyncio, benchmarks)."""
    for mark in ("flaky(max_runs=2): rerun on failure", "asyncio: a coroutine test",
                 "benchmark: a benchmark"):  # fmt: skip
        config.addinivalue_line("markers", mark)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run the test (a coroutine under ``asyncio.run``), again after a failure while a
    ``flaky`` mark allows it."""
    flaky = pyfuncitem.get_closest_marker("flaky")
    runs = int(flaky.kwargs.get("max_runs", 2)) if flaky is not None else 1
    names = pyfuncitem._fixtureinfo.argnames
    arguments = {name: pyfuncitem.funcargs[name] for name in names}
    for run in range(1, runs + 1):
        try:
            if inspect.iscoroutinefunction(pyfuncitem.obj):
                asyncio.run(pyfuncitem.obj(**arguments))
            else:
                pyfuncitem.obj(**arguments)
        except AssertionError:
            if run == runs:
                raise
            sys.stderr.write(f"flaky: {pyfuncitem.nodeid} failed run {run} of {runs}\n")
            continue
        return True
    return True
