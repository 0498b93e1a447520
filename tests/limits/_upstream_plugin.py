"""A pytest plugin that runs ``limits``' own storage and strategy tests on ``shm://``.

Loaded by ``test_upstream`` into a pytest run over the unpacked ``limits`` sdist (its
``tests/``), never into this suite. Their in-memory cases (``-k in-memory``) build
their storage as ``memory://`` (``async+memory://``) and check it is a
``MemoryStorage``: both names lead here to the SHM storages of the URL in
``ORBIT_UPSTREAM_URL``, each new storage emptying the table first, as a new
``MemoryStorage`` starts empty. Their coroutine tests run under ``asyncio.run`` (no
pytest-asyncio), and ``pytest_lazy_fixtures`` (their servers' fixtures, unused by the
in-memory cases) is a stub.
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

from orbitive.limits import AsyncShmStorage, ShmStorage

URL = os.environ.get("ORBIT_UPSTREAM_URL", "")


class UpstreamShmStorage(ShmStorage):
    """``memory://`` in the upstream run: the sync SHM storage, emptied when made."""

    STORAGE_SCHEME = ["memory"]  # noqa: RUF012 - limits registers a list of schemes

    def __init__(
        self, uri: str | None = None, wrap_exceptions: bool = False, **options: Any
    ) -> None:
        super().__init__(URL, wrap_exceptions)
        self.table.reset()


class UpstreamAsyncShmStorage(AsyncShmStorage):
    """``async+memory://`` in the upstream run: the asyncio SHM storage, emptied when made."""

    STORAGE_SCHEME = ["async+memory"]  # noqa: RUF012 - limits registers a list of schemes

    def __init__(
        self, uri: str | None = None, wrap_exceptions: bool = False, **options: Any
    ) -> None:
        super().__init__("async+" + URL, wrap_exceptions)
        self.table.reset()


limits.storage.MemoryStorage = UpstreamShmStorage  # type: ignore[misc, assignment]
limits.aio.storage.MemoryStorage = UpstreamAsyncShmStorage  # type: ignore[misc, assignment]
_lazy = types.ModuleType("pytest_lazy_fixtures")
_lazy.lf = lambda name: None  # type: ignore[attr-defined]
sys.modules.setdefault("pytest_lazy_fixtures", _lazy)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run a coroutine test function to its end under ``asyncio.run``."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    asyncio.run(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names}))
    return True
