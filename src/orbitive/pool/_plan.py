"""What ``Pool.acquire`` hands back, and the policies that decide it.

A policy looks at a snapshot (candidates and the key's budget) and returns a
:class:`Decision`; ``acquire`` then commits it (reserve or claim) and returns
one plan: :class:`LocalReuse`, :class:`RemoteReuse`, :class:`Create`,
:class:`Wait` or :class:`Reject`. All are frozen dataclasses that work with
``match``::

    match pool.acquire(key, Limits(max_live=4), LocalFirst()):
        case LocalReuse(lease): ...
        case RemoteReuse(lease): ...
        case Create(permit): ...
        case Wait(version): ...
        case Reject(reason): ...

No cost figure is built in: whether reusing a remote resource beats creating a
local one is a measurement the embedder makes and expresses in its own policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, Protocol, final

from .._core._errors import MalformedError, shown
from ._values import Candidate, Key, Lease, ResourceId

if TYPE_CHECKING:
    from ._execution import CreationPermit

_U32_MAX: Final = (1 << 32) - 1


@final
@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds for one ``acquire``.

    Attributes:
        max_live: live + creating resources for the key may not exceed this,
            fleet-wide (``>= 1``).
        attempts: rounds of snapshot-decide-commit before answering
            :class:`Wait` (``>= 1``).

    Raises:
        MalformedError: a value is not an int in ``1 .. 2**32 - 1``.
    """

    max_live: int = 1
    attempts: int = 4

    def __post_init__(self) -> None:
        for name in ("max_live", "attempts"):
            value = getattr(self, name)
            if type(value) is not int or not 1 <= value <= _U32_MAX:
                raise MalformedError(
                    f"Limits.{name} must be an int in 1..{_U32_MAX}, got {shown(value)}"
                )


@final
@dataclass(frozen=True, slots=True)
class LocalReuse:
    """A lease on a resource this process owns: accept it and use it here."""

    lease: Lease


@final
@dataclass(frozen=True, slots=True)
class RemoteReuse:
    """A lease on another process's resource: carry it to the owner."""

    lease: Lease


@final
@dataclass(frozen=True, slots=True)
class Create:
    """A creation claim: make the resource, register it, then finish the permit."""

    permit: CreationPermit


@final
@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing usable now; ``pool.wait_capacity(key, version)`` parks until a change."""

    version: int


@final
@dataclass(frozen=True, slots=True)
class Reject:
    """The policy refused the request; ``reason`` says why."""

    reason: str


Plan = LocalReuse | RemoteReuse | Create | Wait | Reject

Action = Literal["reuse", "create", "wait", "reject"]


@final
@dataclass(frozen=True, slots=True)
class Decision:
    """What a :class:`Policy` chose for one snapshot; ``acquire`` commits it.

    Build one with :meth:`reuse`, :meth:`create`, :meth:`wait` or :meth:`reject`.
    """

    action: Action
    id: ResourceId | None = None
    reason: str = ""

    @classmethod
    def reuse(cls, resource: ResourceId) -> Decision:
        """Reserve one unit of ``resource``."""
        return cls("reuse", resource)

    @classmethod
    def create(cls) -> Decision:
        """Claim creation budget for a new resource."""
        return cls("create")

    @classmethod
    def wait(cls) -> Decision:
        """Answer :class:`Wait` with the key's current version."""
        return cls("wait")

    @classmethod
    def reject(cls, reason: str) -> Decision:
        """Answer :class:`Reject` with ``reason``."""
        return cls("reject", reason=reason)


class Policy(Protocol):
    """Chooses what to do with one snapshot of a key."""

    def decide(
        self,
        key: Key,
        candidates: Sequence[Candidate],
        budget: tuple[int, int],
        limits: Limits,
    ) -> Decision:
        """Return a :class:`Decision`.

        Args:
            key: the key being acquired.
            candidates: every live or draining resource registered under it.
            budget: ``(live, creating)`` for the key, fleet-wide.
            limits: the caller's bounds.
        """
        ...


def _load(candidate: Candidate) -> tuple[int, float]:
    return (candidate.reserved + candidate.active, candidate.last_reserve_at)


def _usable(candidates: Sequence[Candidate], *, local: bool) -> list[Candidate]:
    return [c for c in candidates if c.local is local and c.state == "live" and c.free > 0]


def _create_or_wait(budget: tuple[int, int], limits: Limits) -> Decision:
    live, creating = budget
    return Decision.create() if live + creating < limits.max_live else Decision.wait()


@final
@dataclass(frozen=True, slots=True)
class LocalFirst:
    """Least-loaded own resource, else least-loaded remote one, else create, else wait.

    Load is ``reserved + active``, ties broken by the oldest last reservation.
    """

    def decide(
        self,
        key: Key,
        candidates: Sequence[Candidate],
        budget: tuple[int, int],
        limits: Limits,
    ) -> Decision:
        """See :class:`Policy`."""
        for local in (True, False):
            usable = _usable(candidates, local=local)
            if usable:
                return Decision.reuse(min(usable, key=_load).id)
        return _create_or_wait(budget, limits)


@final
@dataclass(frozen=True, slots=True)
class LocalOnly:
    """Least-loaded own resource, else create, else wait; remote ones are invisible."""

    def decide(
        self,
        key: Key,
        candidates: Sequence[Candidate],
        budget: tuple[int, int],
        limits: Limits,
    ) -> Decision:
        """See :class:`Policy`."""
        usable = _usable(candidates, local=True)
        if usable:
            return Decision.reuse(min(usable, key=_load).id)
        return _create_or_wait(budget, limits)
