"""What one store's lock handles report to: its engines, its counters and its held handles.

A :class:`Backend` is the state a :class:`~._store.Store` and every handle it granted
share, and nothing else: the engine (a :class:`~._engine.ClosedEngine` once the store
closed), the engine's asyncio form (made on first use), the counters behind
:meth:`Store.statistics`, and weak references to the handles still alive. The sync
handle (:mod:`._lock`) and the asyncio one (:mod:`._lock_async`) both reach the
store through it, so neither needs the :class:`Store` class, and the import graph
runs one way: ``_store`` -> ``_lock_async`` -> ``_lock`` -> ``_backend`` -> the engines.

In a forked child the backend's mutex and each live handle's are new: the
parent's renewer thread holds a handle's mutex for a whole renewal (a round trip
to the engine), and the child must not inherit it held.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections.abc import Callable
from typing import Any, ClassVar, Protocol, TypeVar

from .._core import _fork
from ._engine import Busy, ClosedEngine, Engine, Grant, StoreStatistics
from ._engine_async import AsyncEngine

#: Makes the store engine's asyncio form; ``open_store`` pairs each engine with its own.
AsyncForm = Callable[[], AsyncEngine[Any, Any]]
#: Names of collected handles :attr:`Backend.holders` keeps before it is purged.
_PURGE_SLACK = 64
#: The share of a ttl and the seconds a handle takes off its local deadline when the
#: engine's clock is not this host's ``time.monotonic()`` (SQLite's ``time.time()``,
#: PostgreSQL's and Redis's server clocks): the rate error between two clocks, and a
#: step of the engine's wall clock (an NTP correction, a virtual machine's clock sync),
#: as Redlock allows for them (its ``CLOCK_DRIFT_FACTOR`` and 2 ms).
CLOCK_DRIFT_FACTOR = 0.01
CLOCK_DRIFT_S = 0.002


class Handle(Protocol):
    """What the backend asks of a handle it granted: its state, and how to stop renewing."""

    _released: bool
    #: ``threading.get_ident()`` of the thread the handle was granted to.
    _thread: int
    #: One holder of its name at most (a lock), kept in :attr:`Backend.holders`; a
    #: counting lease is not (its name has up to ``limit`` holders, in a namespace of
    #: its own).
    exclusive: ClassVar[bool]

    @property
    def owner(self) -> str:
        """The owner string of the tenure."""

    @property
    def fencing_token(self) -> int:
        """The tenure's fencing token."""

    @property
    def lost(self) -> bool:
        """True once the lease is known lost."""

    def _stop_renewer(self) -> None:
        """Stop background renewal (the store is closing)."""

    def _after_fork_in_child(self) -> None:
        """In a forked child: replace what a parent's thread may have held at the fork."""


_H = TypeVar("_H", bound=Handle)


class Counter:
    """Counts events from any thread without a lock.

    :attr:`add` is the ``__next__`` of an ``itertools.count``, one atomic step on
    every CPython build (the idiom ``threading`` and ``asyncio`` use for their own
    counters). A read takes a number too, so :meth:`read` subtracts the numbers
    earlier reads took; reads must not overlap one another (the backend serialises them).
    """

    __slots__ = ("_reads", "add")

    def __init__(self) -> None:
        self.add: Callable[[], int] = itertools.count().__next__
        self._reads = 0

    def read(self) -> int:
        """How many times :attr:`add` was called so far."""
        taken = self.add() - self._reads
        self._reads += 1
        return taken


class Backend:
    """One store's engines, counters and granted handles (see the module docstring).

    Args:
        engine: the store's engine.
        url: the store's URL, password removed (for messages).
        async_form: makes the engine's asyncio form on first asyncio use.
    """

    __slots__ = (
        "__weakref__",
        "_async",
        "_async_form",
        "_granted",
        "_mutex",
        "acquisitions",
        "engine",
        "holders",
        "kind",
        "losses",
        "monotonic",
        "refusals",
        "releases",
        "renewals",
        "url",
    )

    def __init__(self, engine: Engine[Any, Any], url: str, async_form: AsyncForm) -> None:
        self.engine: Engine[Any, Any] = engine  # a ClosedEngine once closed
        self.kind = engine.kind
        self.monotonic = engine.monotonic_clock
        self.url = url
        self.acquisitions = Counter()
        self.refusals = Counter()
        self.renewals = Counter()
        self.losses = Counter()
        self.releases = Counter()
        self._mutex = threading.Lock()  # serialises the counters' reads and the async form's birth
        # Every handle granted here and still alive: a handle's death drops its
        # reference through the callback (set.discard, run in C, no Python frame).
        self._granted: set[weakref.ref[Handle]] = set()
        #: The handle holding each name, granted here and not yet released (weakly,
        #: by the reference ``_granted`` keeps): the blocking helpers refuse to wait
        #: for a name their own thread (or asyncio task) holds, which would never be
        #: released while they wait. A store lock is exclusive, so one handle at
        #: most holds a name (one released, lost, lapsed or collected holds nothing,
        #: see :meth:`holder`); names of collected handles are purged now and then.
        self.holders: dict[str, weakref.ref[Handle]] = {}
        self._async_form = async_form
        self._async: AsyncEngine[Any, Any] | None = None
        _fork.register(self)

    def _after_fork_in_child(self) -> None:
        self._mutex = threading.Lock()  # a parent's thread may have held it at the fork
        for handle in self.handles():
            handle._after_fork_in_child()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` swapped the engine out."""
        return isinstance(self.engine, ClosedEngine)

    def deadline(self, started: float, ttl: float, grant: Grant) -> float:
        """The local ``time.monotonic()`` deadline of a grant requested at ``started``.

        Never later than the engine's expiry: on SHM's clock (this host's monotonic
        clock) the grant's own expiry when sooner; on another clock ``started + ttl``
        less :data:`CLOCK_DRIFT_FACTOR` of ``ttl`` and :data:`CLOCK_DRIFT_S`.
        """
        deadline = started + ttl
        if not self.monotonic:
            return deadline - ttl * CLOCK_DRIFT_FACTOR - CLOCK_DRIFT_S
        if grant.expires_at < deadline:  # min() costs a call
            return grant.expires_at
        return deadline

    def admit(
        self,
        handle: Callable[[Backend, str, str, Grant, float], _H],
        name: str,
        owner: str,
        ttl: float,
        started: float,
        result: Grant | Busy,
    ) -> _H | Busy:
        """The handle of an engine's grant (requested at ``started``), or its refusal, counted."""
        if type(result) is Busy:
            self.refusals.add()
            return result
        lock = handle(self, name, owner, result, self.deadline(started, ttl, result))
        ref: weakref.ref[Handle] = weakref.ref(lock, self._granted.discard)
        self._granted.add(ref)
        if lock.exclusive:
            holders = self.holders
            holders[name] = ref
            if len(holders) > 2 * len(self._granted) + _PURGE_SLACK:
                self.holders = {key: held for key, held in holders.items() if held() is not None}
        self.acquisitions.add()
        return lock

    def holder(self, name: str) -> Handle | None:
        """The live handle granted here that holds ``name``, if any."""
        ref = self.holders.get(name)
        handle = None if ref is None else ref()
        if handle is None or handle._released or handle.lost:
            return None
        return handle

    def asyncio(self) -> AsyncEngine[Any, Any]:
        """The engine's asyncio form, made on first use (a closed store's refuses)."""
        found = self._async
        if found is None:
            with self._mutex:
                if self._async is None:  # a closed store's form refuses in a worker thread
                    closed = self.closed
                    self._async = AsyncEngine(self.engine) if closed else self._async_form()
                found = self._async
        return found

    def handles(self) -> list[Handle]:
        """The handles granted here that are still alive (held or not)."""
        alive = (ref() for ref in list(self._granted))
        return [handle for handle in alive if handle is not None]

    def statistics(self) -> StoreStatistics:
        """The counters, read once each, and the handles held now."""
        held = sum(1 for handle in self.handles() if not handle._released and not handle.lost)
        with self._mutex:
            return StoreStatistics(
                engine=self.kind,
                held_count=held,
                acquired_count=self.acquisitions.read(),
                busy_count=self.refusals.read(),
                renewed_count=self.renewals.read(),
                lost_count=self.losses.read(),
                released_count=self.releases.read(),
            )

    def close(self) -> None:
        """Stop the handles' renewals, swap in a :class:`ClosedEngine`, close both forms."""
        for handle in self.handles():
            handle._stop_renewer()
        engine, self.engine = self.engine, ClosedEngine(self.url)
        with self._mutex:
            asynchronous, self._async = self._async, None
        if asynchronous is not None:
            asynchronous.close()
        engine.close()
