"""Cross-process readiness: which backend, and the per-process readiness descriptor.

A backend is picked once, at import: ``_readiness_futex`` (Linux futex + eventfd)
if its probe passes, else ``_readiness_pipe`` (polling + pipe). Setting
``ORBIT_READINESS=futex`` or ``=pipe`` forces one, so CI runs both on Linux; if
the forced one (or, unforced, every one) cannot run, importing this module raises
:class:`ReadinessUnavailable` listing what was tried and why. The facts each
backend relies on are written at the top of its module. The rest of the package
imports readiness only from here and never checks ``sys.platform``.

:class:`Readiness` turns "this shared u32 generation word changed" into a
descriptor that ``select``, ``selectors`` and asyncio ``loop.add_reader`` can
watch. A daemon driver thread per object runs::

    loop:
        word != last seen   -> remember it, make the descriptor readable,
                               wait until the consumer drains (or close)
        otherwise           -> sleep until the word may have changed
                               (futex wait, or a poll), 1 s at most

Waiting for the drain means a burst of publishes costs the driver one wake-up
(and, given the publishers' lock, no wake syscall: its parked byte is clear).
The one-second bound is a safety net, not a poll.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import threading
from typing import Final, Protocol

from . import _fork, _readiness_futex, _readiness_pipe
from ._errors import FleetError, InvalidLayout, ReadinessUnavailable
from ._readiness_futex import ParkedBytes

__all__ = ["BACKEND", "CriticalSection", "Readiness", "bump", "wait_word", "wake_word"]

_U32: Final = struct.Struct("<I")
#: Longest single sleep of a driver; bounds the delay a lost wake could cause.
SAFETY_TIMEOUT: Final = 1.0
#: Environment variable forcing a backend by name.
ENV_VAR: Final = "ORBIT_READINESS"


class Signal(Protocol):
    """A backend's per-process descriptor."""

    def fileno(self) -> int: ...
    def notify(self) -> None: ...
    def drain(self) -> int: ...
    def close(self) -> None: ...


class Backend(Protocol):
    """What a backend module provides (see ``_readiness_futex`` for the meanings)."""

    @property
    def NAME(self) -> str: ...  # noqa: N802 - module constant
    @property
    def PARKED(self) -> ParkedBytes | None: ...  # noqa: N802 - module constant
    @property
    def Signal(self) -> type[Signal]: ...  # noqa: N802 - module class

    def probe(self) -> None: ...
    def wait_word(
        self, buf: mmap.mmap, offset: int, expected: int, timeout: float | None
    ) -> bool: ...
    def wake_word(self, buf: mmap.mmap, offset: int) -> None: ...
    def bump(self, buf: mmap.mmap, word_offset: int, parked_offset: int, capacity: int) -> None: ...
    def driver_wait(
        self, buf: mmap.mmap, offset: int, expected: int, timeout: float, stop: threading.Event
    ) -> None: ...


class CriticalSection(Protocol):
    """The region's mutex + flock (``Region`` fits), as used around :func:`bump`."""

    def acquire(self) -> object: ...
    def release(self) -> object: ...


BACKENDS: Final[dict[str, Backend]] = {"futex": _readiness_futex, "pipe": _readiness_pipe}


def select_backend(forced: str | None) -> Backend:
    """The first backend whose probe passes, or the ``forced`` one.

    Raises:
        ReadinessUnavailable: ``forced`` is unknown or cannot run, or none can.
    """
    if forced is not None and forced not in BACKENDS:
        raise ReadinessUnavailable(
            f"{ENV_VAR}={forced!r} names no readiness backend; use one of {', '.join(BACKENDS)}"
        )
    tried = []
    for name in [forced] if forced else list(BACKENDS):
        backend = BACKENDS[name]
        try:
            backend.probe()
        except OSError as exc:
            tried.append(f"{name}: {exc}")
            continue
        return backend
    raise ReadinessUnavailable("no readiness backend can run here; tried " + "; ".join(tried))


BACKEND: Final = select_backend(os.environ.get(ENV_VAR) or None)
wait_word: Final = BACKEND.wait_word
wake_word: Final = BACKEND.wake_word
bump: Final = BACKEND.bump


def _check_layout(buf: object, word_offset: int, parked_index: int, node: int) -> None:
    if not isinstance(buf, mmap.mmap):
        raise TypeError(f"readiness needs an mmap.mmap, got {type(buf).__name__}")
    size = len(buf)
    if not (0 <= word_offset <= size - 4 and word_offset % 4 == 0):
        raise InvalidLayout(f"readiness word offset {word_offset} is not an aligned u32 in {size}")
    if node < 0 or not 0 <= parked_index < size:
        raise InvalidLayout(f"readiness parked byte {parked_index} (node {node}) is outside {size}")


class Readiness:
    """Per-process readiness descriptor fed by a driver thread that watches one
    shared u32 generation word. Readable whenever the word changed since the last
    drain (spuriously readable now and then: the caller polls and may find nothing).

    Args:
        buf: the mapping holding the word and the parked bytes.
        word_offset: byte offset of the u32 generation word (4-byte aligned).
        parked_offset: byte offset of the per-node parked bytes.
        node: this process's node; only its byte ``parked_offset + node`` is written.
        name: the driver thread's name.
        lock: the critical section publishers hold around :func:`bump` (the
            ``Region``). With it the driver sets its parked byte only while asleep,
            under the lock, so publishers skip the wake syscall otherwise. Without
            it the byte stays set from construction to ``close()`` and every bump
            wakes; a bump racing the constructor itself may then be seen only at
            the safety timeout. Never call :meth:`close` while holding ``lock``.
        backend: a module of ``BACKENDS``; the one picked at import by default.

    Raises:
        TypeError: ``buf`` is not an ``mmap.mmap``.
        InvalidLayout: an offset lies outside ``buf`` or the word is misaligned.
        OSError: the descriptor or the thread cannot be created.

    A forked child has no driver thread and its node is not the parent's: there
    ``fileno()`` and ``drain()`` raise :class:`FleetError` and ``close()`` only
    closes the child's copies of the descriptors; build a new Readiness in the child.
    """

    def __init__(
        self,
        buf: mmap.mmap,
        word_offset: int,
        parked_offset: int,
        node: int,
        name: str,
        *,
        lock: CriticalSection | None = None,
        backend: Backend | None = None,
    ) -> None:
        self._name = name
        self._backend = BACKEND if backend is None else backend
        self._closed = self._forked = False
        self._signal: Signal | None = None
        self._thread: threading.Thread | None = None
        _check_layout(buf, word_offset, parked_offset + node, node)
        self._buf, self._word, self._byte = buf, word_offset, parked_offset + node
        self._lock = lock
        self._lifelong: ParkedBytes | None = None  # set while it holds the byte for life
        self._stopping = threading.Event()
        self._drained = threading.Event()
        self._error: Exception | None = None
        try:
            self._signal = signal = self._backend.Signal()
            if lock is None and self._backend.PARKED is not None:
                self._backend.PARKED.hold(buf, self._byte)
                self._lifelong = self._backend.PARKED
            self._last = _U32.unpack_from(buf, word_offset)[0]
            self._thread = threading.Thread(target=self._run, args=(signal,), name=name)
            self._thread.daemon = True
            self._thread.start()
        except BaseException:
            self.close()
            raise
        _fork.register(self)

    # -- consumer side -------------------------------------------------------------

    def fileno(self) -> int:
        """The descriptor to watch for readability (select, selectors, asyncio).

        Raises:
            FleetError: closed, or used in a forked child.
        """
        return self._usable_signal().fileno()

    def drain(self) -> int:
        """Clear readiness and let the driver watch again; drain before polling.

        Returns:
            The coalesced count of notifications since the last drain (0 if none),
            not an event count: the events are in whatever the word guards.

        Raises:
            FleetError: closed, used in a forked child, or the driver thread
                stopped on an error (the region was closed under it).
        """
        count = self._usable_signal().drain()
        self._drained.set()
        if self._error is not None:
            raise FleetError(
                f"readiness {self._name!r}: driver stopped: {self._error}"
            ) from self._error
        return count

    def _usable_signal(self) -> Signal:
        if self._forked:
            raise FleetError(
                f"readiness {self._name!r} belongs to the parent process; create one in the child"
            )
        if self._closed or self._signal is None:
            raise FleetError(f"readiness {self._name!r} is closed")
        return self._signal

    # -- driver thread ---------------------------------------------------------------

    def _run(self, signal: Signal) -> None:
        try:
            while not self._stopping.is_set():
                current = _U32.unpack_from(self._buf, self._word)[0]
                if current == self._last:
                    self._park(current)
                    continue
                self._last = current
                self._drained.clear()  # before notify, so a drain right after it counts
                signal.notify()
                self._drained.wait()
        except Exception as exc:  # a daemon must not die silently: drain() raises it
            self._error = exc
            with contextlib.suppress(OSError):
                signal.notify()

    def _park(self, seen: int) -> None:
        backend, buf, parked = self._backend, self._buf, self._backend.PARKED
        if self._lock is None or parked is None:
            backend.driver_wait(buf, self._word, seen, SAFETY_TIMEOUT, self._stopping)
            return
        # Invariant: the byte is set and the word re-read inside the publishers'
        # critical section; _readiness_futex.bump explains why no wake is lost.
        self._lock.acquire()
        try:
            parked.hold(buf, self._byte)
            still = _U32.unpack_from(buf, self._word)[0] == seen
        finally:
            self._lock.release()
        try:
            if still and not self._stopping.is_set():
                backend.driver_wait(buf, self._word, seen, SAFETY_TIMEOUT, self._stopping)
        finally:
            parked.release(buf, self._byte)

    # -- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Stop and join the driver thread, then close the descriptor. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        self._drained.set()
        thread = self._thread
        while thread is not None and not self._forked and thread.is_alive():
            with contextlib.suppress(OSError, ValueError):  # a closed mapping: it is exiting
                self._backend.wake_word(self._buf, self._word)
            thread.join(0.01)  # repeat: the wake may land just before it sleeps
        if self._lifelong is not None and not self._forked:
            with contextlib.suppress(ValueError):  # a closed mapping
                self._lifelong.release(self._buf, self._byte)
        if self._signal is not None:
            self._signal.close()

    def _after_fork_in_child(self) -> None:
        self._forked = True
        if self._signal is not None:
            self._signal.close()  # the child's copies; the parent's stay open

    def __repr__(self) -> str:
        state = "forked" if self._forked else "closed" if self._closed else "open"
        return f"<Readiness {self._name!r} {self._backend.NAME} {state}>"
