"""Named locks with a TTL, an owner and a fencing token (the store contract, docs/architecture.md).

One contract over four engines: a SQLite file (the embedded default), PostgreSQL
or one Redis node (several hosts) and the SHM lock table of a fleet. See
:func:`open_store`. Asyncio code uses ``store.try_lock_async`` and
``store.lock_async`` (an :class:`AsyncLock`). ``store.semaphore(name, limit)`` gives
counting leases (:class:`Semaphore`): up to ``limit`` holders of one name at once.

Name rule: a lock name is a ``str`` of 1 to 255 bytes once UTF-8 encoded, with no
control character (U+0000-U+001F, U+007F-U+009F); owners are non-empty strings of
at most 255 UTF-8 bytes without NUL. Both rules are checked before any engine
call, so they are identical on every engine.
"""

from __future__ import annotations

from .._core._errors import (
    ErrorKind,
    InvalidLockName,
    InvalidLockOwner,
    InvalidLockTtl,
    InvalidSemaphoreLimit,
    InvalidStoreUrl,
    LockNotReentrant,
    LockTimeout,
    SemaphoreLimitMismatch,
    StoreError,
)
from ._engine import LockInfo, SlotInfo
from ._lock import Lock
from ._lock_async import AsyncLock
from ._semaphore import Semaphore
from ._semaphore_lease import SemaphoreLease
from ._semaphore_lease_async import AsyncSemaphoreLease
from ._store import Store
from ._url import open_store

__all__ = [
    "AsyncLock",
    "AsyncSemaphoreLease",
    "ErrorKind",
    "InvalidLockName",
    "InvalidLockOwner",
    "InvalidLockTtl",
    "InvalidSemaphoreLimit",
    "InvalidStoreUrl",
    "Lock",
    "LockInfo",
    "LockNotReentrant",
    "LockTimeout",
    "Semaphore",
    "SemaphoreLease",
    "SemaphoreLimitMismatch",
    "SlotInfo",
    "Store",
    "StoreError",
    "open_store",
]

for _name in __all__:  # tracebacks and reprs name the public module
    globals()[_name].__module__ = __name__
del _name
