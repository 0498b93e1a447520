"""Keyed leases in a fleet-shared SHM table (the lease contract, docs/architecture.md).

One open-addressed state table per fleet holds at most one live entry per
:class:`LockKey`, with a TTL on the host monotonic clock, an opaque
:class:`LockOwner` compared on renew and release, and strictly increasing
fencing tokens. Every transition is also published to a per-node ring whose
readiness descriptor (:meth:`LockTable.fileno`) wakes other processes.
"""

from __future__ import annotations

from .._core._errors import (
    AccessDenied,
    EntryTooLarge,
    IdExhausted,
    InvalidEncoding,
    InvalidLayout,
    InvalidTtl,
    KeyEmpty,
    LayoutMismatch,
    NamespaceEmpty,
    OwnerEmpty,
    StateFull,
)
from ._inspection import LockTableStatistics
from ._layout import LockLayout
from ._lock_table import LockTable
from ._types import Acquired, Fence, LockEvent, LockKey, LockLease, LockOwner, LockPoll, Occupied

__all__ = [
    "AccessDenied",
    "Acquired",
    "EntryTooLarge",
    "Fence",
    "IdExhausted",
    "InvalidEncoding",
    "InvalidLayout",
    "InvalidTtl",
    "KeyEmpty",
    "LayoutMismatch",
    "LockEvent",
    "LockKey",
    "LockLayout",
    "LockLease",
    "LockOwner",
    "LockPoll",
    "LockTable",
    "LockTableStatistics",
    "NamespaceEmpty",
    "Occupied",
    "OwnerEmpty",
    "StateFull",
]

for _cls in (
    Acquired,
    Fence,
    LockEvent,
    LockKey,
    LockLayout,
    LockLease,
    LockOwner,
    LockPoll,
    LockTable,
    LockTableStatistics,
    Occupied,
    EntryTooLarge,
    IdExhausted,
    InvalidEncoding,
    InvalidTtl,
    KeyEmpty,
    NamespaceEmpty,
    OwnerEmpty,
    StateFull,
):
    _cls.__module__ = __name__
del _cls
