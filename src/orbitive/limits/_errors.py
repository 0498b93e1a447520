"""The errors of ``orbitive.limits``' storages."""

from __future__ import annotations

from .._core._errors import OrbitError


class InvalidRateStorageUrl(OrbitError, ValueError):
    """A rate-limit storage URL is malformed or names an unknown option; the message
    says what to change (and never shows a password)."""
