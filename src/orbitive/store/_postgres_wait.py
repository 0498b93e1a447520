"""psycopg connections (sync and asyncio) whose every wait ends at the call's deadline.

psycopg runs each statement as a generator and waits for the socket in
``Connection.wait``, with no bound of its own: a connection that went silent
(no FIN, no RST, no reply) blocks the caller for as long as the kernel keeps it
open. Since psycopg 3.2, ``wait`` takes a ``timeout`` and raises
``psycopg.errors._WaitTimeout`` (an ``OperationalError``) past it; this subclass
passes the time left before :attr:`DeadlineConnection.deadline`, so every step of a
statement (send, read, commit) shares one budget. The connection is unusable after
such a timeout (a reply may still be in flight): the engine drops it.

The asyncio form matters even more: a task cancelled in a statement makes
psycopg send the server a cancel request and wait up to 5 s for it and 5 s for
the statement, over the same silent network; a bounded wait instead ends with
the timeout error, and the engine drops the connection.

Imported only once psycopg is known to be installed (``_postgres._psycopg``).
"""

from __future__ import annotations

import time
from typing import Any, Final

import psycopg
from psycopg.abc import RV, PQGen

#: psycopg's own poll interval (``psycopg.connection._WAIT_INTERVAL``), in seconds.
_WAIT_INTERVAL_S: Final = 0.1

if tuple(map(int, psycopg.__version__.split(".")[:2])) < (3, 2):  # wait() took no timeout
    raise ImportError(f"psycopg {psycopg.__version__} is too old: 3.2 or later is needed")


class DeadlineConnection(psycopg.Connection[Any]):
    """A psycopg connection whose waits end at :attr:`deadline` (``time.monotonic()``)."""

    #: End of the current call; None while no call runs (no bound).
    deadline: float | None = None

    def wait(
        self, gen: PQGen[RV], interval: float = _WAIT_INTERVAL_S, timeout: float | None = None
    ) -> RV:
        """psycopg's wait, bounded by the time left before :attr:`deadline`."""
        if self.deadline is not None:
            left = max(self.deadline - time.monotonic(), 0.0)
            timeout = left if timeout is None else min(timeout, left)
        return super().wait(gen, interval, timeout)


class AsyncDeadlineConnection(psycopg.AsyncConnection[Any]):
    """The asyncio twin of :class:`DeadlineConnection`."""

    #: End of the current call; None while no call runs (no bound).
    deadline: float | None = None

    async def wait(
        self, gen: PQGen[RV], interval: float = _WAIT_INTERVAL_S, timeout: float | None = None
    ) -> RV:
        """psycopg's wait, bounded by the time left before :attr:`deadline`."""
        if self.deadline is not None:
            left = max(self.deadline - time.monotonic(), 0.0)
            timeout = left if timeout is None else min(timeout, left)
        return await super().wait(gen, interval, timeout)
