"""Closing the clients a return retires, off the returning caller's path.

A return that the table refuses to keep idle (another process waits at
``max_live`` and this client's turn is over, or the fleet holds ``max_idle``
idle clients) must close the client and only then unregister it, so the server
never sees more than ``max_live`` connections. The close takes a round trip or
more (psycopg waits for the server to end the session). The request that handed
the client over has no reason to wait for it: the pool's closing threads (daemon
threads, per ClientPool per process) do the closing, and the budget returns once
each close is done, exactly as when the caller closed it.

A close runs in a thread that is free, or in a new one while every thread is
busy, up to :data:`MOST_THREADS`: one close that hangs (a server that never
answers) holds its own thread only, and the others go on. Threads start with the
first retirement of a process life (a forked child makes its own);
:meth:`Retirer.close` waits for every queued close, so ``ClientPool.close()``
still returns with this process's clients closed; the threads of a pool dropped
without ``close()`` end once it is collected. At interpreter exit the closes
still queued are waited for, at most :data:`EXIT_WAIT_S` (the threads are
daemons: without the wait they would be cut off, and the server would see its
sessions drop instead of end).
"""

from __future__ import annotations

import atexit
import os
import queue
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Final

from ._entry import Entry

if TYPE_CHECKING:
    from ._client_pool import ClientPool

#: Most closing threads of one pool in one process (closes beyond them queue).
MOST_THREADS: Final = 8

#: Longest wait, at interpreter exit, for the closes still queued (seconds).
EXIT_WAIT_S: Final = 5.0


class Retirer:
    """The closing threads of one ClientPool in this process."""

    def __init__(self, pool: ClientPool[Any]) -> None:
        self._pool = weakref.ref(pool)
        self._queue: queue.SimpleQueue[Entry[Any] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._free = 0  # threads free for the next close (negative: closes queued)
        self._closed = False
        weakref.finalize(pool, _wake, self._queue)  # a pool dropped unclosed: threads end

    def put(self, entry: Entry[Any]) -> bool:
        """Close ``entry``'s client, then unregister it, in a closing thread.

        Returns False, queueing nothing, once :meth:`close` ran: the caller closes it.
        """
        with self._lock:
            if self._closed:
                return False
            self._queue.put(entry)
            self._free -= 1
            if self._free < 0 and len(self._threads) < MOST_THREADS:
                self._start_thread()  # every thread is busy closing: one more
        return True

    def _start_thread(self) -> None:
        if not self._threads:  # the first of this process life
            atexit.register(_at_exit, weakref.ref(self), os.getpid())
        thread = threading.Thread(target=self._run, name="orbit-clients-retire", daemon=True)
        self._threads.append(thread)
        self._free += 1
        thread.start()

    def _run(self) -> None:
        while (entry := self._queue.get()) is not None:
            pool = self._pool()
            if pool is None:
                return
            try:
                pool._retire(entry)
            except BaseException:  # a close's SystemExit, say: no caller to reach here
                pool.counters.close_errors += 1  # its budget returned, as after an Exception
            del pool
            with self._lock:
                self._free += 1

    def close(self, timeout: float | None = None) -> None:
        """Refuse further clients, close every queued one and stop the threads.

        Idempotent; every call (a second caller's too) returns once the queued closes are
        done, except in a closing thread (a close that closes the pool), which waits
        for the other threads only.

        Args:
            timeout: seconds to wait at most for the closes (None: until done).
        """
        with self._lock:
            if not self._closed:
                self._closed = True
                for _ in self._threads:
                    self._queue.put(None)
            threads = list(self._threads)
        end = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(None if end is None else max(0.0, end - time.monotonic()))


def _at_exit(retirer: weakref.ref[Retirer], pid: int) -> None:
    """Wait for a pool's queued closes as the interpreter exits (not in a forked child,
    which inherits the handler but not the threads)."""
    found = retirer()
    if found is not None and os.getpid() == pid:
        found.close(EXIT_WAIT_S)


def _wake(closes: queue.SimpleQueue[Entry[Any] | None]) -> None:
    """End every closing thread of a pool that was collected (SimpleQueue.put is safe
    in a finalizer; a None nobody takes goes with the queue)."""
    for _ in range(MOST_THREADS):
        closes.put(None)
