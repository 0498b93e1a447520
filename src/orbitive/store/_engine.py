"""The engine interface: the primitives every store engine implements, and their values.

Each primitive is one transaction or one table step; arguments arrive validated
by :mod:`._base`, which owns every rule of the contract.
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass
from typing import (
    Any,
    ClassVar,
    Generic,
    NamedTuple,
    NoReturn,
    Protocol,
    TypeVar,
    final,
)

from .._core._errors import ErrorKind, StoreError


class LockInfo(NamedTuple):
    """A snapshot of one live lease (immutable).

    A named tuple rather than a frozen dataclass, as ``LockLease`` is: one is
    built per refusal and per inspected lease, and a tuple is built in less than
    half the time.

    Attributes:
        name: the lock name.
        owner: the owner string the holder passed.
        fencing_token: strictly larger for every acquisition in the store.
        expires_at: on the engine's clock: Unix epoch seconds (SQLite, PostgreSQL,
            Redis) or ``time.monotonic()`` seconds (shm).
        remaining_s: seconds left when the snapshot was read, on the engine's clock.
    """

    name: str
    owner: str
    fencing_token: int
    expires_at: float
    remaining_s: float


class Grant(Protocol):
    """An engine's grant of a tenure, as the contract reads it.

    The engine gets the same object back in :meth:`Engine.renew` and
    :meth:`Engine.release`, so it may carry whatever the engine needs to find the
    tenure again: the SHM engine returns its table's ``LockLease`` as it is.
    """

    @property
    def fencing_token(self) -> int:
        """Strictly larger for every acquisition in the store; a renew keeps it."""

    @property
    def expires_at(self) -> float:
        """End of the window on the engine's clock (see :attr:`LockInfo.expires_at`)."""


class Granted(NamedTuple):
    """The :class:`Grant` of the SQL engines: the token and the expiry, nothing more."""

    fencing_token: int
    expires_at: float


_G = TypeVar("_G", bound=Grant)


@final
class Busy(NamedTuple):
    """An engine's refusal; ``holder`` is the live lease when it was seen."""

    holder: LockInfo | None


@final
@dataclass(frozen=True, slots=True)
class StoreStatistics:
    """Counters of one :class:`Store` object (this process only)."""

    engine: str
    held_count: int
    acquired_count: int
    busy_count: int
    renewed_count: int
    lost_count: int
    released_count: int


class Engine(abc.ABC, Generic[_G]):
    """The primitives an engine implements; each is one transaction or one table step.

    Generic in the engine's own :class:`Grant` type, which only the engine reads.

    Arguments arrive validated. ``acquire`` grants only when no live lease holds the
    name, with a fencing token larger than any before; ``renew`` and ``release``
    act only on the exact tenure (name, owner and fencing token) and only while it
    is live. Engines are thread-safe and notice when they run in a forked child.
    """

    #: Engine name shown in reprs and statistics.
    kind: ClassVar[str]
    #: Longest pause between attempts of the blocking helper, in seconds.
    poll_cap_s: ClassVar[float] = 0.05
    #: True when ``expires_at`` is ``time.monotonic()`` seconds (then it also bounds
    #: the handle's local deadline).
    monotonic_clock: ClassVar[bool] = False

    @abc.abstractmethod
    def acquire(self, name: str, owner: str, ttl: float) -> _G | Busy:
        """Grant ``name`` to ``owner`` for ``ttl`` seconds, or report the holder."""

    @abc.abstractmethod
    def renew(self, name: str, owner: str, grant: _G, ttl: float) -> _G | None:
        """A new full window of ``ttl`` seconds from now; None when the tenure is gone.

        ``grant`` is the tenure's latest grant from this engine (by acquire or renew).
        """

    @abc.abstractmethod
    def release(self, name: str, owner: str, grant: _G) -> bool:
        """Remove the exact tenure of ``grant``; True only if it was still live."""

    @abc.abstractmethod
    def inspect(self, name: str) -> LockInfo | None:
        """The live lease on ``name``, if any."""

    @abc.abstractmethod
    def locks(self) -> list[LockInfo]:
        """Every live lease, sorted by name."""

    @abc.abstractmethod
    def force_release(self, name: str) -> bool:
        """Remove whatever holds ``name``; True if a live lease was removed."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections or mappings; idempotent."""

    def arm(self) -> None:  # an optional hook; only engines with readiness override it
        """Prepare for :meth:`wait` before an attempt (clear readiness); default no-op."""

    def wait(self, delay: float) -> None:
        """Pause up to ``delay`` seconds, returning early if the engine signals a change."""
        time.sleep(delay)


@final
class ClosedEngine(Engine[Any]):
    """The engine of a closed store: every primitive raises ``StoreError(CLOSED)``.

    A store swaps it in on close, so the open path needs no check of its own.
    """

    kind = "closed"

    def __init__(self, url: str) -> None:
        self._url = url

    def _refuse(self) -> NoReturn:
        raise StoreError(f"store {self._url!r} is closed", kind=ErrorKind.CLOSED)

    def acquire(self, name: str, owner: str, ttl: float) -> NoReturn:
        self._refuse()

    def renew(self, name: str, owner: str, grant: object, ttl: float) -> NoReturn:
        self._refuse()

    def release(self, name: str, owner: str, grant: object) -> NoReturn:
        self._refuse()

    def inspect(self, name: str) -> NoReturn:
        self._refuse()

    def locks(self) -> NoReturn:
        self._refuse()

    def force_release(self, name: str) -> NoReturn:
        self._refuse()

    def arm(self) -> NoReturn:
        self._refuse()

    def close(self) -> None:
        """Nothing left to close."""
