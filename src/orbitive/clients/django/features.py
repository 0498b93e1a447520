"""The engine's database features: Django's PostgreSQL ones, with its health checks kept."""

from __future__ import annotations

from django.db.backends.postgresql import features as postgresql
from django.utils.functional import cached_property

__all__ = ["DatabaseFeatures"]


class DatabaseFeatures(postgresql.DatabaseFeatures):
    """Django's PostgreSQL features.

    Django 5.1 skips two of its own tests when ``OPTIONS["pool"]`` is set,
    since its pool leaves out the per-request health check. The engine keeps
    that check (a connection that fails it is closed, not handed back), so
    those tests run.
    """

    @cached_property  # Django's is one too (the stubs say a plain dict: hence the ignore)
    def django_test_skips(self) -> dict[str, set[str]]:  # type: ignore[override]
        """Django's own test suite's skips for this backend (read by its runner only)."""
        skips = dict(super().django_test_skips)
        skips.pop("Pool does implicit health checks", None)
        return skips
