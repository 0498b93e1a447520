"""Every error orbitive raises on purpose, in one place.

Hierarchy (who is at fault decides the tier; the built-in mixed in lets callers
catch by the usual Python category)::

    OrbitError
    +-- argument errors (the caller passed something invalid)
    |   +-- InvalidName (ValueError)             fleet name, store lock name
    |   +-- NodeOutsideFleet, InvalidCapacity (ValueError) +-- CapacityMismatch
    |   +-- InvalidArgumentType (TypeError)      not a LockKey, LockOwner, lease, token
    |   +-- InvalidTtl (ValueError, TypeError)   ttl <= 0, NaN, inf, bool, non-number
    |   +-- NamespaceEmpty, KeyEmpty, OwnerEmpty (ValueError)
    |   +-- InvalidEncoding (ValueError)         a str with no UTF-8 form (lone surrogate)
    |   +-- EntryTooLarge (ValueError)
    |   +-- InvalidLayout (ValueError)
    +-- AccessDenied (PermissionError)           foreign owner, wider mode, symlink
    +-- shared bytes are wrong
    |   +-- LayoutMismatch                       an existing object differs or is corrupt
    |   +-- MalformedError (ValueError)          pool: bad id, frame, spec
    +-- SessionClosed (EOFError)                 a session stream ended between frames
    +-- capacity errors
    |   +-- StateFull                            lock table has no free slot
    |   +-- IdExhausted                          a counter ran out of bits
    |   +-- KeyFullError, LaneFullError          pool key table / own resource lane full
    |   +-- BusyError, CreationBudgetError       no free unit / max_live reached
    +-- peer-state errors
    |   +-- StaleError, DrainingError, NotOwnerError, NotReservedError
    +-- FleetError                               node taken, fleet in use, closed handle
    |   +-- ShmFull                              no room in /dev/shm for a new object
    +-- ReadinessUnavailable (OSError)           no readiness backend could start
    +-- StoreError                               store contract (kind: ErrorKind)
    |   +-- InvalidLockName (InvalidName, TypeError)     kind INVALID_INPUT
    |   +-- InvalidLockOwner (ValueError, TypeError)     kind INVALID_INPUT
    |   +-- InvalidLockTtl (InvalidTtl)                  kind DATABASE (duration guard)
    |   +-- InvalidStoreUrl (ValueError)                 kind INVALID_INPUT
    |   +-- InvalidSemaphoreLimit (ValueError, TypeError) kind INVALID_INPUT
    |   +-- SemaphoreLimitMismatch                       kind INVALID_INPUT
    |   +-- LockNotReentrant (RuntimeError)              kind INVALID_INPUT
    +-- LockTimeout (TimeoutError)               blocking helper gave up
    +-- client pool errors (see the section below), and the budget's:
        +-- InvalidBudget (InvalidPoolOptions)   a bad Budget, or a total below min_idle
        |   +-- BudgetMismatch                   another total for the budget's name
        +-- BudgetUnavailable                    the coordinator cannot be reached
        +-- UnsafeCoordinator                    the coordinator can forget units it granted
    +-- rate-limit storages (orbitive.limits), see the section below

Every error carries ``fleet``, ``node``, ``key`` and ``kind`` attributes (``None``
when they do not apply) and survives pickling, so worker processes can return
them to a parent.
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar, Final, cast

__all__ = [
    "AccessDenied",
    "BudgetMismatch",
    "BudgetUnavailable",
    "BusyError",
    "ClientCreateError",
    "CreationBudgetError",
    "DrainingError",
    "EntryTooLarge",
    "ErrorKind",
    "FleetError",
    "IdExhausted",
    "InvalidBudget",
    "InvalidEncoding",
    "InvalidLayout",
    "InvalidLockName",
    "InvalidLockOwner",
    "InvalidLockTtl",
    "InvalidName",
    "InvalidPoolOptions",
    "InvalidRateAmount",
    "InvalidRateExpiry",
    "InvalidRateKey",
    "InvalidRateStorageUrl",
    "InvalidSemaphoreLimit",
    "InvalidStoreUrl",
    "InvalidTtl",
    "KeyEmpty",
    "KeyFullError",
    "LaneFullError",
    "LayoutMismatch",
    "LockNotReentrant",
    "LockTimeout",
    "MalformedError",
    "NamespaceEmpty",
    "NodeOutsideFleet",
    "NotOwnerError",
    "NotReservedError",
    "OrbitError",
    "OwnerEmpty",
    "PoolClosed",
    "PoolTimeout",
    "RateTableFull",
    "ReadinessUnavailable",
    "RemoteRequestError",
    "SemaphoreLimitMismatch",
    "SessionClosed",
    "ShmFull",
    "StaleError",
    "StateFull",
    "StoreError",
    "TooManyRequests",
    "UnknownClient",
    "UnsafeCoordinator",
    "WindowTooLarge",
]


#: Longest value shown in a message, in characters.
SHOWN_MAX: Final = 60
#: Ints wider than this many bits are shown by their width, not their digits.
_SHOWN_BITS: Final = 256


def shown(value: object) -> str:
    """``repr(value)`` for a message: at most :data:`SHOWN_MAX` characters, never raising.

    An int too wide to print cheaply (``repr`` raises ``ValueError`` past 4300
    digits) shows its width in bits, and an object whose ``__repr__`` raises shows
    its type, so an error about a hostile argument is still the named error.
    """
    if issubclass(type(value), int):  # type(), not isinstance: __class__ may lie
        number = int.__index__(cast(int, value))  # the stored value, hooks bypassed
        if number.bit_length() > _SHOWN_BITS:
            return f"{'a negative' if number < 0 else 'an'} int of {number.bit_length()} bits"
    try:
        text = str.__str__(repr(value))  # an exact str, whatever __repr__ returned
    except Exception:  # a hostile __repr__: the type is enough
        return f"<{type(value).__name__} object>"
    return text if len(text) <= SHOWN_MAX else text[: SHOWN_MAX - 3] + "..."


def _rebuild(cls: type[OrbitError], message: str, attrs: dict[str, Any]) -> OrbitError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(attrs)
    return error


class OrbitError(Exception):
    """Root of every error orbitive raises on purpose.

    Args:
        message: a lower-case sentence naming the object and the numbers.
        fleet: the fleet name, when one applies.
        node: the node id, when one applies.
        key: the lock key, pool key or store name, when one applies.
        kind: the SHM kind number, or the store :class:`ErrorKind`.
    """

    fleet: str | None
    node: int | None
    key: object
    kind: object

    def __init__(
        self,
        message: str,
        *,
        fleet: str | None = None,
        node: int | None = None,
        key: object = None,
        kind: object = None,
    ) -> None:
        super().__init__(message)
        self.fleet = fleet
        self.node = node
        self.key = key
        self.kind = kind

    @property
    def message(self) -> str:
        """The message the error was raised with."""
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, dict(self.__dict__)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


# -- argument errors -----------------------------------------------------------


class InvalidName(OrbitError, ValueError):
    """A fleet name or store lock name breaks its documented rule."""


class NodeOutsideFleet(OrbitError, ValueError):
    """A node id is negative or not below the fleet capacity."""


class InvalidCapacity(OrbitError, ValueError):
    """A fleet capacity is not an int in the allowed range, or differs from the fleet's."""


class CapacityMismatch(InvalidCapacity):
    """A valid capacity that is not the one the fleet was created with (it lives in
    ``/dev/shm`` until ``orbit clear FLEET --all --yes``); the message says what to do."""


class InvalidArgumentType(OrbitError, TypeError):
    """An argument has the wrong type (a LockKey, LockOwner, lease or token was expected)."""


class InvalidTtl(OrbitError, ValueError, TypeError):
    """A ttl is not a finite number of seconds greater than zero (bools refused)."""


class NamespaceEmpty(OrbitError, ValueError):
    """A lock key has an empty namespace."""


class KeyEmpty(OrbitError, ValueError):
    """A lock key has an empty label."""


class OwnerEmpty(OrbitError, ValueError):
    """A lock owner is empty."""


class InvalidEncoding(OrbitError, ValueError):
    """A str key part or owner has no UTF-8 form (it holds a lone surrogate)."""


class EntryTooLarge(OrbitError, ValueError):
    """Namespace, label and owner together exceed the layout's payload."""


class InvalidLayout(OrbitError, ValueError):
    """A layout (geometry, kinds) is not valid on its own."""


# -- access --------------------------------------------------------------------


class AccessDenied(OrbitError, PermissionError):
    """An SHM object or lock path is owned by another user, too open, or a symlink."""


# -- shared bytes --------------------------------------------------------------


class LayoutMismatch(OrbitError):
    """An existing SHM object has another layout, or its bytes are corrupt."""


class MalformedError(OrbitError, ValueError):
    """A pool id, spec, or session frame is not well formed."""


class SessionClosed(OrbitError, EOFError):
    """The peer closed a session stream cleanly before the first byte of a lease frame."""


# -- capacity ------------------------------------------------------------------


class StateFull(OrbitError):
    """The lock table has no empty, tombstoned or expired slot for a new key."""


class IdExhausted(OrbitError):
    """A fencing-token or revision counter has no more values."""


class KeyFullError(OrbitError):
    """The pool key table has no room for another key in this epoch."""


class LaneFullError(OrbitError):
    """This node's resource lane in the pool has no free slot."""


class BusyError(OrbitError):
    """A resource has no free unit (or no free pending-reservation entry)."""


class CreationBudgetError(OrbitError):
    """live + creating has reached the caller's max_live for a key."""


# -- peer state ----------------------------------------------------------------


class StaleError(OrbitError):
    """A resource id or lease names a slot that was closed or reused."""


class DrainingError(OrbitError):
    """A resource is draining: no new reservation or accept."""


class NotOwnerError(OrbitError):
    """Only the resource's owner (node and incarnation) may do this."""


class NotReservedError(OrbitError):
    """A lease's fence is not pending: accepted already, aged out, or cancelled."""


# -- fleet, readiness ----------------------------------------------------------


class FleetError(OrbitError):
    """A fleet operation cannot proceed (node taken, fleet in use, closed handle)."""


class ShmFull(FleetError):
    """``/dev/shm`` has no room for a new object of the fleet; the message gives the
    bytes asked and free and what to do (smaller objects, or a larger ``/dev/shm``)."""


class ReadinessUnavailable(OrbitError, OSError):
    """No readiness backend could be started; the message lists what was tried."""


# -- store ---------------------------------------------------------------------


class ErrorKind(enum.Enum):
    """Classification of a :class:`StoreError`, in the store contract's terms."""

    DATABASE = "database"
    INVALID_INPUT = "invalid_input"
    UNAVAILABLE = "unavailable"
    CLOSED = "closed"


class StoreError(OrbitError):
    """An error from the named-lock store contract; ``kind`` is an :class:`ErrorKind`.

    ``kind`` defaults to the class's ``default_kind`` (``DATABASE`` here).
    """

    kind: ErrorKind
    default_kind: ClassVar[ErrorKind] = ErrorKind.DATABASE

    def __init__(self, message: str, *, kind: ErrorKind | None = None, key: object = None) -> None:
        super().__init__(message, key=key, kind=self.default_kind if kind is None else kind)


class InvalidLockName(StoreError, InvalidName, TypeError):
    """A store lock name breaks the store's name rule (see ``orbitive.store``)."""

    default_kind = ErrorKind.INVALID_INPUT


class InvalidLockOwner(StoreError, ValueError, TypeError):
    """A store lock owner is not a non-empty string within the length limit."""

    default_kind = ErrorKind.INVALID_INPUT


class InvalidLockTtl(StoreError, InvalidTtl):
    """The store duration guard: ttl <= 0, NaN, inf or not a number (kind ``DATABASE``).

    The validator's own :class:`InvalidTtl` is kept as ``__cause__``.
    """


class InvalidStoreUrl(StoreError, ValueError):
    """``open_store`` got a URL it cannot parse or whose scheme it does not know."""

    default_kind = ErrorKind.INVALID_INPUT


class InvalidSemaphoreLimit(StoreError, ValueError, TypeError):
    """A semaphore limit is not an int in ``1..LIMIT_MAX`` (see ``orbitive.store``)."""

    default_kind = ErrorKind.INVALID_INPUT


class SemaphoreLimitMismatch(StoreError):
    """A semaphore is held under another limit than the one asked for.

    ``limit`` is the limit asked for, ``found`` the limit its live holders were
    granted under (0 when not given). Once every holder is gone (released or
    lapsed), any limit is accepted again.
    """

    default_kind = ErrorKind.INVALID_INPUT

    def __init__(
        self,
        message: str,
        *,
        kind: ErrorKind | None = None,
        key: object = None,
        limit: int = 0,
        found: int = 0,
    ) -> None:
        super().__init__(message, kind=kind, key=key)
        self.limit = limit
        self.found = found


class LockNotReentrant(StoreError, RuntimeError):
    """The blocking helper was asked for a name the calling thread (or asyncio task)
    holds already in the store: store locks are not re-entrant, and the wait would
    never end. Raised at once, before any wait."""

    default_kind = ErrorKind.INVALID_INPUT


class LockTimeout(OrbitError, TimeoutError):
    """The blocking lock helper did not get the lock within its timeout."""


# -- client pool (orbitive.clients) ----------------------------------------------
#
#   OrbitError
#   +-- InvalidPoolOptions (ValueError, TypeError)   a bad option, callable or key
#   +-- UnknownClient (ValueError)                   putconn of a client not checked out here
#   +-- PoolTimeout (TimeoutError)                   no client within acquire_timeout
#   +-- PoolClosed                                   the client pool was closed
#   +-- TooManyRequests                              max_waiting callers already wait here
#   +-- ClientCreateError                            the user's create() failed (its error
#                                                    is the __cause__); no claim is left
#   +-- RemoteRequestError                           the owner's handler failed a remote request


class InvalidPoolOptions(OrbitError, ValueError, TypeError):
    """A client pool option, callable or key breaks its documented rule."""


class UnknownClient(OrbitError, ValueError):
    """A client handed back to a pool that did not check it out (or already took it back)."""


class PoolTimeout(OrbitError, TimeoutError):
    """No client could be checked out within the timeout."""


class PoolClosed(OrbitError):
    """The client pool is closed: no checkout is possible."""


class TooManyRequests(OrbitError):
    """This process already has ``max_waiting`` callers waiting for a client."""


class ClientCreateError(OrbitError):
    """The user's ``create()`` raised; the original error is the ``__cause__``."""


class RemoteRequestError(OrbitError):
    """Another process's handler raised while serving this process's remote request."""


# -- a budget shared by many hosts (orbitive.clients.Budget) ----------------------
#
#   OrbitError
#   +-- InvalidPoolOptions
#   |   +-- InvalidBudget                        a bad Budget argument, or a total below
#   |       |                                    a pool's min_idle
#   |       +-- BudgetMismatch                   the budget's name is held under another total
#   +-- BudgetUnavailable                        the coordinator cannot be reached (its
#   |                                            StoreError is the __cause__)
#   +-- UnsafeCoordinator                        the coordinator can forget the units it
#                                                granted (a restart or a crash)


class InvalidBudget(InvalidPoolOptions):
    """A :class:`~orbitive.clients.Budget` argument breaks its rule, or a pool's
    ``min_idle`` is above the budget's ``total``."""


class BudgetMismatch(InvalidBudget):
    """The budget's name is in use under another ``total`` (on the coordinator, or by
    another pool of this host); ``total`` is the one asked for, ``found`` the one in use."""

    def __init__(
        self, message: str, *, total: int | None = None, found: int | None = None, **where: Any
    ) -> None:
        super().__init__(message, **where)
        self.total = total
        self.found = found


class BudgetUnavailable(OrbitError):
    """The budget's coordinator could not be reached when a pool started; the store's
    error is the ``__cause__``."""


class UnsafeCoordinator(OrbitError):
    """The coordinator can forget units it granted: a Redis server without an append-only
    file, or a PostgreSQL server with ``fsync`` off. A restart would then let a unit
    be held twice."""


# -- rate-limit storages (orbitive.limits) ------------------------------------------
#
#   OrbitError
#   +-- InvalidRateStorageUrl (ValueError)      a malformed shm:// URL, an unknown option,
#   |                                           a size out of range
#   +-- InvalidRateKey (TypeError)              a rate-limit key that is not a str
#   +-- InvalidRateAmount (ValueError, TypeError)  an amount or limit that is not an int >= 1
#   +-- InvalidRateExpiry (ValueError, TypeError)  an expiry that is not a finite number > 0
#   +-- WindowTooLarge (ValueError)             a moving-window limit above the table's window
#   +-- RateTableFull                           no free entry or window slot near the key's home


class InvalidRateStorageUrl(OrbitError, ValueError):
    """A rate-limit storage URL is malformed, names an unknown option, or sizes the
    table out of range; the message names the option and its range."""


class InvalidRateKey(OrbitError, TypeError):
    """A rate-limit key is not a ``str``."""


class InvalidRateAmount(OrbitError, ValueError, TypeError):
    """An amount (cost) or limit is not an ``int`` of at least 1 (``bool`` is refused)."""


class InvalidRateExpiry(OrbitError, ValueError, TypeError):
    """An expiry is not a finite number of seconds above 0."""


class WindowTooLarge(OrbitError, ValueError):
    """A moving-window limit is larger than the timestamps a window slot of the table
    holds (the URL's ``window`` option)."""


class RateTableFull(OrbitError):
    """The rate-limit table has no free or expired entry (or moving-window slot) within
    the probe neighbourhood of a new key's home; nothing was counted."""
