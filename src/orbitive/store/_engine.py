"""The engine interface: the primitives every store engine implements, and their values.

Each primitive is one transaction or one table step; arguments arrive validated
by :mod:`._guards`, which owns every rule of the contract. The named-lock
primitives act on one name; the counting-lease (semaphore) primitives act on
the slots of one semaphore name, a namespace of its own: a semaphore and a lock
of the same name never meet. Renew and release of counting leases take a batch
of one owner's grants of one name, so a holder of several units renews them in
one step. How the blocking helper waits between two attempts on a name is the
engine's :class:`Waiter`: jittered polling by default; the SHM engine's is woken
by the release itself.
"""

from __future__ import annotations

import abc
import random
import time
from collections.abc import Sequence
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

from .._core._errors import ErrorKind, SemaphoreLimitMismatch, StoreError
from ._guards import LIMIT_MAX
from ._notifications import Subscription


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


class SlotInfo(NamedTuple):
    """A snapshot of one live holder of a semaphore (immutable).

    Attributes:
        name: the semaphore name.
        slot: which of the ``limit`` slots it holds, ``0 <= slot < limit``.
        limit: the limit the holder was granted under.
        owner: the owner string the holder passed.
        fencing_token: strictly larger than every earlier token of the name.
        expires_at: on the engine's clock (see :attr:`LockInfo.expires_at`).
        remaining_s: seconds left when the snapshot was read, on the engine's clock.
    """

    name: str
    slot: int
    limit: int
    owner: str
    fencing_token: int
    expires_at: float
    remaining_s: float


def limit_mismatch(name: str, limit: int, found: int) -> SemaphoreLimitMismatch:
    """The error of an acquisition of ``name`` under ``limit`` while it is held under ``found``."""
    return SemaphoreLimitMismatch(
        f"semaphore {name!r} is held under limit {found}, not {limit}: every user of a "
        "name must ask for one limit (a new one is accepted once every holder is gone)",
        key=name,
        limit=limit,
        found=found,
    )


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


class UnitGrant(Grant, Protocol):
    """An engine's grant of one slot of a semaphore: a :class:`Grant` that names its slot."""

    @property
    def slot(self) -> int:
        """Which slot of the semaphore the tenure holds."""


class Granted(NamedTuple):
    """The :class:`Grant` of the SQL engines: the token and the expiry, nothing more."""

    fencing_token: int
    expires_at: float


class UnitGranted(NamedTuple):
    """The :class:`UnitGrant` of the SQL engines: the slot, the token and the expiry."""

    slot: int
    fencing_token: int
    expires_at: float


_G = TypeVar("_G", bound=Grant)
_U = TypeVar("_U", bound=UnitGrant)
#: First pause of a polling waiter between attempts, in seconds (doubles, jittered).
_POLL_FIRST_S = 0.002
#: The largest attempt number the pause doubles for.
POLL_DOUBLINGS = 20


@final
class Busy(NamedTuple):
    """An engine's refusal; ``holder`` is the live lease when it was seen.

    For a semaphore, ``holder`` is the holder whose lease ends first (the
    earliest a slot can free up by lapse), or None when none was seen.
    """

    holder: LockInfo | SlotInfo | None


def poll_pause_s(busy: Busy, left: float | None, tries: int, cap_s: float) -> float:
    """How long a polling waiter pauses after its ``tries``-th refusal, in seconds (no I/O).

    Jittered doubling from 2 ms up to ``cap_s``, never past the holder's expiry nor
    the ``left`` seconds of the caller's timeout (None: no timeout). The blocking
    and the asyncio helpers both pause by it.
    """
    delay = random.uniform(0.5, 1.0) * min(cap_s, _POLL_FIRST_S * 2.0 ** min(tries, POLL_DOUBLINGS))
    if busy.holder is not None:
        delay = min(delay, busy.holder.remaining_s + 0.001)
    return delay if left is None else min(delay, left)


class Waiter:
    """How the blocking helper waits between attempts on one name: by polling.

    The helper calls :meth:`enter` once, :meth:`queue` when the engine said
    :meth:`Engine.queues_first`, :meth:`look` before every attempt, :meth:`wait`
    after every refusal, and :meth:`leave` at the end, granted or not. An engine
    told of releases returns its own from :meth:`Engine.waiter`.
    """

    #: It watches for releases from :meth:`enter` and :meth:`look` on, so the
    #: helper attempts again right after entering, before it first waits.
    watches = False

    def __init__(self, cap_s: float) -> None:
        self._cap_s = cap_s

    def enter(self) -> None:
        """Start waiting (nothing to do when polling)."""

    def queue(self, left: float | None) -> None:
        """Wait behind the name's other waiters (for at most ``left`` seconds)."""

    def look(self) -> None:
        """Before every attempt (nothing to do when polling)."""

    def wait(self, busy: Busy, left: float | None, tries: int) -> None:
        """Pause after the ``tries``-th refusal, at most ``left`` seconds (None: no timeout)."""
        time.sleep(poll_pause_s(busy, left, tries, self._cap_s))

    def leave(self, granted: bool) -> None:
        """Stop waiting (nothing to do when polling)."""


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


class Engine(abc.ABC, Generic[_G, _U]):
    """The primitives an engine implements; each is one transaction or one table step.

    Generic in the engine's own :class:`Grant` and :class:`UnitGrant` types, which
    only the engine reads.

    Arguments arrive validated. ``acquire`` grants only when no live lease holds the
    name, with a fencing token larger than any before; ``renew`` and ``release``
    act only on the exact tenure (name, owner and fencing token) and only while it
    is live. ``acquire_unit`` grants a free slot only while fewer than ``limit``
    live leases hold the semaphore, all granted under that same limit. Engines are
    thread-safe and notice when they run in a forked child.
    """

    #: Engine name shown in reprs and statistics.
    kind: ClassVar[str]
    #: Longest pause between attempts of the blocking helper, in seconds.
    poll_cap_s: ClassVar[float] = 0.05
    #: True when ``expires_at`` is ``time.monotonic()`` seconds (then it also bounds
    #: the handle's local deadline).
    monotonic_clock: ClassVar[bool] = False
    #: Largest semaphore limit the engine holds, and (when below ``LIMIT_MAX``) why,
    #: as the refusal quotes it.
    limit_max: ClassVar[int] = LIMIT_MAX
    limit_rule: ClassVar[str] = ""

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
    def acquire_unit(self, name: str, limit: int, owner: str, ttl: float) -> _U | Busy:
        """Grant ``owner`` the lowest free slot of semaphore ``name`` for ``ttl`` seconds.

        Returns:
            The grant, or :class:`Busy` when ``limit`` live leases hold the name.

        Raises:
            SemaphoreLimitMismatch: live holders of ``name`` were granted under
                another limit (nothing is granted).
        """

    @abc.abstractmethod
    def renew_units(
        self, name: str, owner: str, grants: Sequence[_U], ttl: float
    ) -> list[_U | None]:
        """A new full window of ``ttl`` seconds for each tenure of ``grants``, in one step.

        Returns:
            One entry per grant, in order: the renewed grant, or None when that
            tenure is gone.
        """

    @abc.abstractmethod
    def release_units(self, name: str, owner: str, grants: Sequence[_U]) -> list[bool]:
        """Remove the exact tenures of ``grants`` in one step; True for each one still live."""

    @abc.abstractmethod
    def holders(self, name: str) -> list[SlotInfo]:
        """The live holders of semaphore ``name``, by slot."""

    @abc.abstractmethod
    def semaphores(self) -> list[SlotInfo]:
        """Every live holder of every semaphore, by name (UTF-8 order) and slot."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections or mappings; idempotent."""

    def subscribe(self, name: str) -> Subscription | None:
        """Wake-ups for a waiter of semaphore ``name``: released units of that name.

        None (the default) when the engine has no notifications of its own: the
        waiter then waits as :meth:`unit_waiter` says.
        """
        return None

    def unit_waiter(self, name: str) -> Waiter:
        """How a semaphore waiter without a subscription waits for ``name`` between
        attempts (default: polling)."""
        del name
        return Waiter(self.poll_cap_s)

    def queues_first(self, name: str) -> bool:
        """Whether the blocking helper waits behind ``name``'s waiters before a first
        attempt (some wait, or this thread has just handed it over to one of them);
        default False."""
        del name
        return False

    def waiter(self, name: str) -> Waiter:
        """How the blocking helper waits for ``name`` between attempts (default: polling)."""
        del name
        return Waiter(self.poll_cap_s)


@final
class ClosedEngine(Engine[Any, Any]):
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

    def acquire_unit(self, name: str, limit: int, owner: str, ttl: float) -> NoReturn:
        self._refuse()

    def renew_units(self, name: str, owner: str, grants: Sequence[object], ttl: float) -> NoReturn:
        self._refuse()

    def release_units(self, name: str, owner: str, grants: Sequence[object]) -> NoReturn:
        self._refuse()

    def holders(self, name: str) -> NoReturn:
        self._refuse()

    def semaphores(self) -> NoReturn:
        self._refuse()

    def close(self) -> None:
        """Nothing left to close."""
