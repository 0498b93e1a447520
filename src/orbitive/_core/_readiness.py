"""Cross-process readiness: which word backend, and the per-process readiness descriptor.

A word backend is picked once, at import: ``_readiness_futex`` (Linux futex) if
its probe passes, else ``_readiness_pipe`` (polling). Setting
``ORBIT_READINESS=futex`` or ``=pipe`` forces one, so CI runs both on Linux; if
the forced one (or, unforced, every one) cannot run, importing this module raises
:class:`ReadinessUnavailable` listing what was tried and why. The facts each
backend relies on are written at the top of its module. The rest of the package
imports readiness only from here and never checks ``sys.platform``.

A backend sleeps a thread on a shared u32 word (:func:`wait_word`) and wakes it
(:func:`wake_word`, :func:`bump`): the pool's blocking waits and the lock
table's key waits. :class:`Readiness` is the descriptor ``select``, ``selectors``
and asyncio ``loop.add_reader`` watch instead: a Unix datagram socket that the
publisher of a :class:`~._channel.Channel` writes to directly, whatever the
backend (see ``_channel`` for the protocol). No thread runs in between: a
publish in one process makes the descriptor readable in another in one wake-up.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
from typing import Final, Protocol

from . import _fork, _readiness_futex, _readiness_pipe
from ._channel import Channel
from ._errors import FleetError, ReadinessUnavailable
from ._readiness_futex import ParkedBytes

__all__ = ["BACKEND", "Channel", "Readiness", "bump", "wait_word", "wake_word"]

#: Environment variable forcing a backend by name.
ENV_VAR: Final = "ORBIT_READINESS"


class Backend(Protocol):
    """What a backend module provides (see ``_readiness_futex`` for the meanings)."""

    @property
    def NAME(self) -> str: ...  # noqa: N802 - module constant
    @property
    def PARKED(self) -> ParkedBytes | None: ...  # noqa: N802 - module constant

    def probe(self) -> None: ...
    def wait_word(
        self, buf: mmap.mmap, offset: int, expected: int, timeout: float | None
    ) -> bool: ...
    def wake_word(self, buf: mmap.mmap, offset: int, count: int = ...) -> int: ...
    def bump(self, buf: mmap.mmap, word_offset: int, parked_offset: int, capacity: int) -> None: ...


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


class Readiness:
    """Per-process readiness descriptor of one channel: readable after a publish on it.

    A Unix datagram socket (see ``_channel``): each publish that finds this
    descriptor armed sends it one datagram, so it is readable from that publish
    until :meth:`drain` (spuriously now and then: the caller polls and may find
    nothing). No thread runs for it.

    Args:
        channel: the word and armed bytes to watch.
        node: this process's node; only its armed byte is written.
        name: how reprs and errors name it.

    Raises:
        InvalidLayout: ``node`` is outside the fleet.
        FleetError: the node watches ``channel`` with too many descriptors, or the
            region is closed.
        AccessDenied: another user's file holds the socket's path.
        OSError: the socket cannot be created.

    A forked child's node is not the parent's: there ``fileno()`` and ``drain()``
    raise :class:`FleetError` and ``close()`` only closes the child's copy of the
    descriptor; build a new Readiness in the child.
    """

    def __init__(self, channel: Channel, node: int, name: str) -> None:
        self._name = name
        self._channel = channel
        self._node = node
        self._closed = self._forked = False
        self._sock: socket.socket | None = None
        self._sock, self._bit = channel.open_socket(node)
        try:
            channel.arm(node, self._bit)
        except BaseException:
            self.close()
            raise
        _fork.register(self)

    def fileno(self) -> int:
        """The descriptor to watch for readability (select, selectors, asyncio).

        Raises:
            FleetError: closed, or used in a forked child.
        """
        return self._usable().fileno()

    def drain(self) -> int:
        """Clear readiness and arm the descriptor again; drain before polling.

        Returns:
            The coalesced count of signals since the last drain (0 if none), not
            an event count: the events are in whatever the word guards.

        Raises:
            FleetError: closed, used in a forked child, or the region was closed.
        """
        sock = self._usable()
        count = 0
        with contextlib.suppress(BlockingIOError):
            while True:
                sock.recv(64)
                count += 1
        if count:  # the publisher took the bit: arm it again (else it is still set)
            self._channel.arm(self._node, self._bit)
        return count

    def _usable(self) -> socket.socket:
        if self._forked:
            raise FleetError(
                f"readiness {self._name!r} belongs to the parent process; create one in the child"
            )
        if self._closed or self._sock is None:
            raise FleetError(f"readiness {self._name!r} is closed")
        return self._sock

    def close(self) -> None:
        """Close the descriptor and give its bit back. Idempotent."""
        if self._closed:
            return
        self._closed = True
        sock, self._sock = self._sock, None
        if sock is not None and not self._forked:
            self._channel.close_socket(sock, self._node, self._bit)

    def _after_fork_in_child(self) -> None:
        self._forked = True
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()  # the child's copy; the parent's socket and file stay

    def __repr__(self) -> str:
        state = "forked" if self._forked else "closed" if self._closed else "open"
        return f"<Readiness {self._name!r} node={self._node} {state}>"
