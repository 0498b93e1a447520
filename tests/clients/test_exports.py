"""orbitive.clients and its adapters export exactly their documented names, under their path."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pytest

#: api.md's names for the client pool, plus the additions this package documents.
API_NAMES = {
    "orbitive.clients": {"ClientPool", "PoolOptions", "Budget"},
    "orbitive.clients.psycopg": {"ConnectionPool"},
    # The Django engine is named by its path in settings; Django loads its base module.
    "orbitive.clients.django": set(),
    "orbitive.clients.sqlalchemy": {"FleetPool", "AsyncFleetPool"},
    "orbitive.clients.asyncpg": {"create_pool"},
}
ADDITIONS = {
    # statistics() and the named errors a caller catches.
    "orbitive.clients": {
        "ClientPoolStatistics",
        "ClientCreateError",
        "InvalidPoolOptions",
        "PoolClosed",
        "PoolTimeout",
        "RemoteRequestError",
        "TooManyRequests",
        "UnknownClient",
        # a budget's named errors (bad input, another total, no coordinator, an unsafe one)
        "InvalidBudget",
        "BudgetMismatch",
        "BudgetUnavailable",
        "UnsafeCoordinator",
    },
    # psycopg_pool's errors, which are psycopg_pool's own when it is installed.
    "orbitive.clients.psycopg": {
        "AsyncConnectionPool",
        "PoolClosed",
        "PoolTimeout",
        "TooManyRequests",
        "check_connection",
        "check_connection_async",
    },
    "orbitive.clients.sqlalchemy": set(),
    "orbitive.clients.django": set(),
    # What Django looks up in an engine's modules.
    "orbitive.clients.django.base": {"DatabaseWrapper"},
    "orbitive.clients.django.creation": {"DatabaseCreation"},
    "orbitive.clients.django.features": {"DatabaseFeatures"},
    # what create_pool returns, and what its acquire() returns (asyncpg's names).
    "orbitive.clients.asyncpg": {"Pool", "PoolAcquireContext"},
}


@pytest.mark.parametrize("module_name", sorted(ADDITIONS))
def test_all_is_exactly_the_documented_names(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert len(set(module.__all__)) == len(module.__all__), "duplicate in __all__"
    assert set(module.__all__) == API_NAMES.get(module_name, set()) | ADDITIONS[module_name]
    for name in module.__all__:
        assert hasattr(module, name), name


@pytest.mark.parametrize("module_name", sorted(ADDITIONS))
def test_public_classes_name_a_public_module_that_exports_them(module_name: str) -> None:
    module = importlib.import_module(module_name)
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isclass(obj):
            home = importlib.import_module(obj.__module__)
            assert obj.__module__ in ADDITIONS, f"{module_name}.{name} claims {obj.__module__}"
            assert getattr(home, name) is obj


def test_the_core_package_does_not_import_the_adapters_dependencies() -> None:
    code = (
        "import sys, orbitive, orbitive.clients, orbitive.pool, orbitive.store; "
        "print(any(m in sys.modules for m in ('psycopg', 'sqlalchemy', 'django', 'celery')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.stdout.strip() == "False", result.stderr
