"""Storages for the `limits` package that share one limit across every worker.

Importing this module registers its schemes with ``limits`` (which finds storages by
their ``STORAGE_SCHEME``), so ``storage_from_string("shm://web")`` and
flask-limiter's or slowapi's ``storage_uri="shm://web"`` find them. See docs/limits.md.

This package imports ``limits``; the rest of orbitive never does (extra
``orbitive[limits]``).
"""

from __future__ import annotations

from ._errors import InvalidRateStorageUrl as InvalidRateStorageUrl
from ._postgres_storage import PostgresStorage as PostgresStorage
from ._postgres_storage_async import AsyncPostgresStorage as AsyncPostgresStorage
