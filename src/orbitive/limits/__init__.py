"""Storages for the `limits` package that share one limit across every worker.

Importing this module registers its schemes with ``limits`` (which finds storages by
their ``STORAGE_SCHEME``), so ``storage_from_string("shm://web")`` and
flask-limiter's or slowapi's ``storage_uri="shm://web"`` find them. See docs/limits.md.

This package imports ``limits``; the rest of orbitive never does (extra
``orbitive[limits]``).
"""

from __future__ import annotations

from .._core._errors import (
    InvalidRateAmount,
    InvalidRateExpiry,
    InvalidRateKey,
    InvalidRateStorageUrl,
    RateTableFull,
    WindowTooLarge,
)
from ._layout import Geometry
from ._shm_storage import ShmStorage
from ._shm_storage_async import AsyncShmStorage

__all__ = [
    "AsyncShmStorage",
    "Geometry",
    "InvalidRateAmount",
    "InvalidRateExpiry",
    "InvalidRateKey",
    "InvalidRateStorageUrl",
    "RateTableFull",
    "ShmStorage",
    "WindowTooLarge",
]
