"""The engine's test-database creation: Django's, with this process's pool closed first.

PostgreSQL refuses to copy (``CREATE DATABASE ... TEMPLATE``) or drop a
database while sessions are connected to it, and the pool keeps idle ones.
Django 5.1 and later close their own pool at these two points; the engine does
the same on every Django version.
"""

from __future__ import annotations

from typing import Any

from django.db.backends.postgresql import creation as postgresql

__all__ = ["DatabaseCreation"]


class DatabaseCreation(postgresql.DatabaseCreation):
    """Django's PostgreSQL test-database creation that closes the alias's pool first."""

    # django-stubs leave out these two private steps: hence the ignores.

    def _clone_test_db(self, suffix: Any, verbosity: int, keepdb: bool = False) -> None:
        self.connection.close()
        self.connection.close_pool()
        super()._clone_test_db(suffix, verbosity, keepdb)  # type: ignore[misc]

    def _destroy_test_db(self, test_database_name: str, verbosity: int) -> None:
        self.connection.close_pool()
        super()._destroy_test_db(test_database_name, verbosity)  # type: ignore[misc]
