"""Storages for the `limits` package that share one limit across every worker.

Importing this module registers its schemes with ``limits`` (which finds storages by
their ``STORAGE_SCHEME``), so ``storage_from_string("shm://web")`` and
flask-limiter's or slowapi's ``storage_uri="shm://web"`` find them. See docs/limits.md.

This package imports ``limits``; the rest of orbitive never does (extra
``orbitive[limits]``).

``shm://FLEET[?capacity=1024&windows=256&window=128]`` (:class:`ShmStorage`) and
``async+shm://FLEET[...]`` (:class:`AsyncShmStorage`) keep every counter in one
fixed-size shared-memory table of the fleet (304 KiB with the defaults), exact across
the host's processes and safe against a process killed inside a step. Their errors,
all :class:`orbitive.OrbitError`: :class:`InvalidRateStorageUrl` (a bad URL or
option), :class:`InvalidRateKey` (a key that is not a ``str``),
:class:`InvalidRateAmount` (an amount or limit that is not an ``int``),
:class:`InvalidRateExpiry` (an expiry that is not a finite number of seconds above 0),
:class:`WindowTooLarge` (a moving-window limit above the URL's ``window``) and
:class:`RateTableFull` (no room near a new key's home; nothing counted).
"""

from __future__ import annotations

from ._errors import (
    InvalidRateAmount,
    InvalidRateExpiry,
    InvalidRateKey,
    InvalidRateStorageUrl,
    RateTableFull,
    WindowTooLarge,
)
from ._postgres_storage import PostgresStorage
from ._postgres_storage_async import AsyncPostgresStorage
from ._shm_storage import ShmStorage
from ._shm_storage_async import AsyncShmStorage

__all__ = [
    "AsyncPostgresStorage",
    "AsyncShmStorage",
    "InvalidRateAmount",
    "InvalidRateExpiry",
    "InvalidRateKey",
    "InvalidRateStorageUrl",
    "PostgresStorage",
    "RateTableFull",
    "ShmStorage",
    "WindowTooLarge",
]

for _name in __all__:  # tracebacks and reprs name the public module
    globals()[_name].__module__ = __name__
del _name
