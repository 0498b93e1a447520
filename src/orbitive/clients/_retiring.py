"""Closing the clients a return retires, off the returning caller's path.

A return that the table refuses to keep idle (another process waits at
``max_live`` and this client's turn is over, or the fleet holds ``max_idle``
idle clients) must close the client and only then unregister it, so the server
never sees more than ``max_live`` connections. The close takes a round trip or
more (psycopg waits for the server to end the session). The request that handed
the client over has no reason to wait for it: one daemon thread per ClientPool
per process does the closing, in order, and the budget returns once each close
is done, exactly as when the caller closed it.

The thread starts with the first retirement of a process life (a forked child
makes its own); :meth:`Retirer.close` waits for every queued close, so
``ClientPool.close()`` still returns with this process's clients closed.
"""

from __future__ import annotations

import queue
import threading
import weakref
from typing import TYPE_CHECKING, Any

from ._entry import Entry

if TYPE_CHECKING:
    from ._pool import ClientPool


class Retirer:
    """The closing thread of one ClientPool in this process."""

    def __init__(self, pool: ClientPool[Any]) -> None:
        self._pool = weakref.ref(pool)
        self._queue: queue.SimpleQueue[Entry[Any] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def put(self, entry: Entry[Any]) -> bool:
        """Close ``entry``'s client, then unregister it, in the closing thread.

        Returns False, queueing nothing, once :meth:`close` ran: the caller closes it.
        """
        with self._lock:
            if self._closed:
                return False
            self._queue.put(entry)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="orbit-clients-retire", daemon=True
                )
                self._thread.start()
        return True

    def _run(self) -> None:
        while (entry := self._queue.get()) is not None:
            pool = self._pool()
            if pool is None:
                return
            try:
                pool._retire(entry)
            except BaseException:  # a close's SystemExit, say: no caller to reach here
                pool.counters.close_errors += 1
                pool._unregister(entry)  # as after a close that raised an Exception
            del pool

    def close(self) -> None:
        """Refuse further clients, close every queued one and stop the thread. Idempotent."""
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
            if thread is not None:
                self._queue.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join()
