"""The errors of ``orbitive.limits``' storages.

Hierarchy (every one an :class:`orbitive.OrbitError`)::

    OrbitError
    +-- InvalidRateStorageUrl (ValueError)         a malformed URL, an unknown option,
    |                                              a size out of range, a keyword option
    +-- InvalidRateKey (TypeError)                 a rate-limit key that is not a str
    +-- InvalidRateAmount (ValueError, TypeError)  an amount or limit that is not an int
    +-- InvalidRateExpiry (ValueError, TypeError)  an expiry that is not a finite number > 0
    +-- WindowTooLarge (ValueError)                a moving-window limit above the shm://
    |                                              table's window
    +-- RateTableFull                              no free entry or window slot near a new
                                                   key's home in the shm:// table
"""

from __future__ import annotations

from .._core._errors import OrbitError


class InvalidRateStorageUrl(OrbitError, ValueError):
    """A rate-limit storage URL is malformed or names an unknown option; the message
    says what to change (and never shows a password)."""


class InvalidRateKey(OrbitError, TypeError):
    """A rate-limit key is not a ``str``."""


class InvalidRateAmount(OrbitError, ValueError, TypeError):
    """An amount (cost) or limit is not an ``int`` of at least 1 (a limit: 0), or is a
    ``bool``."""


class InvalidRateExpiry(OrbitError, ValueError, TypeError):
    """An expiry is not a finite number of seconds above 0."""


class WindowTooLarge(OrbitError, ValueError):
    """A moving-window limit is larger than the timestamps a window slot of the
    ``shm://`` table holds (the URL's ``window`` option)."""


class RateTableFull(OrbitError):
    """The ``shm://`` rate-limit table has no free or expired entry (or moving-window
    slot) within the probe neighbourhood of a new key's home; nothing was counted."""
