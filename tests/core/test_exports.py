"""Public namespaces export exactly the api.md names, and their classes name the public path."""

from __future__ import annotations

import importlib
import inspect

import pytest

#: api.md names per public module, plus the additions this package documents.
API_NAMES = {
    "orbitive": {"Fleet", "OrbitError", "native"},
    "orbitive.lock": {
        "LockTable",
        "LockLayout",
        "LockKey",
        "LockOwner",
        "LockLease",
        "Acquired",
        "Occupied",
        "LockEvent",
        "LockPoll",
        "Fence",
        "InvalidTtl",
        "NamespaceEmpty",
        "KeyEmpty",
        "OwnerEmpty",
        "EntryTooLarge",
        "StateFull",
        "IdExhausted",
        "InvalidLayout",
        "LayoutMismatch",
        "AccessDenied",
    },
    "orbitive.pool": {
        "Pool",
        "Key",
        "Limits",
        "LocalFirst",
        "LocalOnly",
        "Policy",
        "Incarnation",
        "LocalReuse",
        "RemoteReuse",
        "Create",
        "Wait",
        "Reject",
        "Lease",
        "Execution",
        "CreationPermit",
        "ResourceId",
        "Candidate",
        "StaleError",
        "BusyError",
        "DrainingError",
        "NotOwnerError",
        "NotReservedError",
        "CreationBudgetError",
        "KeyFullError",
        "LaneFullError",
        "MalformedError",
    },
    "orbitive.pool.session": {
        "open_session",
        "accept_session",
        "open_session_async",
        "accept_session_async",
    },
    "orbitive.store": {"open_store", "Store", "Lock", "LockInfo", "StoreError", "ErrorKind"},
}
ADDITIONS = {
    # The errors Fleet raises, and those every SHM layer shares (lock re-exports some).
    "orbitive": {
        "__version__",
        "AccessDenied",
        "CapacityMismatch",
        "FleetError",
        "InvalidArgumentType",
        "InvalidCapacity",
        "InvalidLayout",
        "InvalidName",
        "LayoutMismatch",
        "NodeOutsideFleet",
        "ShmFull",
    },
    # A str key part or owner with no UTF-8 form (a lone surrogate).
    "orbitive.lock": {"LockTableStatistics", "InvalidEncoding"},
    # What a custom Policy returns, the death helper, statistics(), the layout error.
    "orbitive.pool": {
        "POOL_KIND",
        "Decision",
        "Plan",
        "DeathWatch",
        "PoolStatistics",
        "KeyStatistics",
        "ResourceStatistics",
        "LayoutMismatch",
    },
    # A clean end of a session stream, so a serving loop can stop on it.
    "orbitive.pool.session": {"SessionClosed"},
    # The store's named errors, so callers can catch them without a private import.
    "orbitive.store": {
        "AsyncLock",  # the handle of try_lock_async / lock_async (api.md names no class)
        "InvalidLockName",
        "InvalidLockOwner",
        "InvalidLockTtl",
        "InvalidStoreUrl",
        "LockNotReentrant",  # the blocking helper asked for a name the caller holds
        "LockTimeout",
        # Counting leases (api.md: store.semaphore(name, limit)): the handle and its
        # asyncio twin, the slot snapshot, and their named errors.
        "Semaphore",
        "SemaphoreLease",
        "AsyncSemaphoreLease",
        "SlotInfo",
        "InvalidSemaphoreLimit",
        "SemaphoreLimitMismatch",
    },
}
PUBLIC_MODULES = sorted(API_NAMES)


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_all_is_exactly_the_api_names_plus_documented_additions(module_name: str) -> None:
    module = importlib.import_module(module_name)
    exported = set(module.__all__)
    assert len(exported) == len(module.__all__), "duplicate in __all__"
    assert API_NAMES[module_name] <= exported, API_NAMES[module_name] - exported
    assert exported == API_NAMES[module_name] | ADDITIONS[module_name]
    for name in module.__all__:
        assert hasattr(module, name), name


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_public_classes_name_a_public_module_that_exports_them(module_name: str) -> None:
    module = importlib.import_module(module_name)
    for name in module.__all__:
        obj = getattr(module, name)
        if not inspect.isclass(obj):
            continue
        home = obj.__module__
        assert home in PUBLIC_MODULES, f"{module_name}.{name} claims module {home}"
        assert getattr(importlib.import_module(home), name) is obj


def test_version_is_a_string() -> None:
    assert isinstance(importlib.import_module("orbitive").__version__, str)
