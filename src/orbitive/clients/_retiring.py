"""Retiring: every close of a ClientPool's clients, sync and asyncio side by side.

A client is retired in two steps, in this order: its ``close`` (the close of the
pool that created it, :attr:`~._ledger.Entry.close`), then its resource is
unregistered, so its unit of ``max_live`` returns only once the client is
closed and the server never sees more than ``max_live`` connections. The
unregister runs whatever the close did, a ``BaseException`` included, exactly
once per client.

Where a close runs:

* :meth:`Retiring.retire`: in the caller, which waits (a discard, a client
  handed back to a closed pool, ``close()``); :meth:`Retiring.retire_async`
  awaits it without blocking the loop, and a caller cancelled meanwhile leaves
  it running (a sync ``close`` in a worker thread, a coroutine ``close`` in a
  task), so the budget still returns once it is done.
* :meth:`Retiring.hand_over`: off the caller's path, for a return the table did
  not keep idle (another process waits at ``max_live`` and the client's turn is
  over, or the fleet holds ``max_idle`` idle clients), and for a client whose
  check or reset was interrupted. The close takes a round trip or more
  (psycopg waits for the server to end the session) and the caller has no
  reason to wait for it. A sync ``close`` runs in one of the pool's closing
  threads; a coroutine ``close`` runs in a task of the running loop. A
  coroutine close that ends cancelled (the loop ending under it, as
  ``asyncio.run`` cancels the tasks left once its coroutine returns, or its own
  CancelledError) may have closed nothing, so a closing thread calls it again
  on a loop of its own: the one case where ``close`` is called twice.
* :meth:`Retiring.release`: the retirements nobody waits for (a pool dropped
  unclosed, a ``close()`` interrupted part way) in a closing thread of their own.

A close runs in a closing thread that is free, or in a new one while every
thread is busy, up to :data:`MOST_THREADS` per pool per process: one close that
hangs (a server that never answers) holds its own thread only, and the others
go on. Threads start with the first retirement of a process life (a forked
child makes its own). :meth:`Retiring.shut` finishes every queued close and
waits for the threads, so ``ClientPool.close()`` returns with this process's
clients closed; the threads of a pool dropped unclosed end once their queue is
done (:meth:`Retiring.end`). At interpreter exit the closes still queued are
waited for, at most :data:`EXIT_WAIT_S` (the threads are daemons: without the
wait they would be cut off, and the server would see its sessions drop instead
of end).
"""

from __future__ import annotations

import asyncio
import atexit
import inspect
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final

from ._callbacks import call_async, run_anywhere
from ._ledger import Entry, Ledger
from ._statistics import Counters

#: Most closing threads of one pool in one process (closes beyond them queue).
MOST_THREADS: Final = 8

#: Longest wait, at interpreter exit, for the closes still queued (seconds).
EXIT_WAIT_S: Final = 5.0


class Retiring:
    """The closing of one ClientPool's clients in this process: its closing threads and
    its closing tasks, over the key's ledger (which unregisters) and the pool's counters."""

    def __init__(self, ledger: Ledger[Any], counters: Counters) -> None:
        self._ledger, self._counters = ledger, counters
        self._queue: queue.SimpleQueue[Entry[Any] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []  # every closing thread, for the waits
        self._workers = 0  # the threads that take closes from the queue
        self._free = 0  # workers free for the next close (negative: closes queued)
        self._ended = False
        self._tasks: set[asyncio.Task[None]] = set()

    # -- in the caller ------------------------------------------------------------------

    def close_quietly(self, client: Any, close: Callable[[Any], Any]) -> None:
        """``close(client)``; its Exception is counted, a BaseException propagates.

        A coroutine ``close`` runs to completion on a loop of its own
        (:func:`~._callbacks.run_anywhere`).
        """
        try:
            run_anywhere(close, client)
        except Exception:
            self._counters.close_errors += 1
        self._counters.closed += 1

    async def close_quietly_async(self, client: Any, close: Callable[[Any], Any]) -> None:
        """Asyncio twin of :meth:`close_quietly`: a coroutine ``close`` on this loop, a
        sync one in a worker thread."""
        try:
            await call_async(close, client)
        except Exception:
            self._counters.close_errors += 1
        self._counters.closed += 1

    def retire(self, entry: Entry[Any]) -> None:
        """Close the client, then unregister it (also after a close that raised a
        BaseException, which propagates)."""
        try:
            self.close_quietly(entry.client, entry.close)
        finally:
            self._unregister(entry)

    async def retire_async(self, entry: Entry[Any]) -> None:
        """Asyncio twin of :meth:`retire`; a caller cancelled or interrupted meanwhile
        leaves the close running, and the budget returns once it is done."""
        await asyncio.shield(self._retirement(entry))

    def retire_all(self, entries: Sequence[Entry[Any]]) -> None:
        """:meth:`retire` each in turn; an interrupted one (a close raising
        KeyboardInterrupt) leaves the rest to :meth:`release` before it propagates."""
        for done, entry in enumerate(entries, 1):
            try:
                self.retire(entry)
            except BaseException:
                self.release(entries[done:])
                raise

    async def retire_all_async(self, entries: Sequence[Entry[Any]]) -> None:
        """Asyncio twin of :meth:`retire_all`: every close starts before the first await,
        so none is lost to a caller cancelled or a loop ended before they ran, and each
        runs to its end."""
        if entries:
            await asyncio.shield(asyncio.gather(*[self._retirement(entry) for entry in entries]))

    def _retirement(self, entry: Entry[Any]) -> asyncio.Future[None]:
        """``entry``'s retirement, started now: a coroutine ``close`` in a task of this
        loop (:meth:`_closing`), a sync one in a worker thread."""
        if inspect.iscoroutinefunction(entry.close):
            return self._closing(entry)
        return asyncio.get_running_loop().run_in_executor(None, self.retire, entry)

    # -- off the caller's path ----------------------------------------------------------

    def hand_over(self, entry: Entry[Any]) -> None:
        """Retire ``entry`` off the caller's path (see the module); once :meth:`end` ran,
        in the caller, before this returns."""
        if inspect.iscoroutinefunction(entry.close) and _loop_running():
            self._closing(entry)
        else:
            self._to_thread(entry)

    def close_later(self, client: Any, close: Callable[[Any], Any]) -> None:
        """Close a client that was never registered, in a task of the running loop."""
        self._spawn(self.close_quietly_async(client, close))

    def release(self, entries: Sequence[Entry[Any]]) -> None:
        """Retire ``entries`` in a closing thread of their own, whatever the state: the
        retirements nobody waits for (a pool dropped unclosed, a close interrupted)."""
        if entries:
            with self._lock:
                self._start_thread(self._retire_each, list(entries))

    # -- lifecycle ----------------------------------------------------------------------

    def end(self) -> None:
        """Refuse further hand-overs (the caller then retires), and let every worker end
        once the closes queued before are done. Idempotent; does not wait."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
            for _ in range(self._workers):
                self._queue.put(None)

    def shut(self, timeout: float | None = None) -> None:
        """:meth:`end`, then wait for every closing thread (at most ``timeout`` seconds,
        None: until done), except the calling one (a close that closes the pool).

        Every call (a second caller's too) returns once the queued closes are done.
        """
        self.end()
        with self._lock:
            threads = list(self._threads)
        end = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(None if end is None else max(0.0, end - time.monotonic()))

    async def wait_closing(self) -> None:
        """Wait for the closing tasks of this loop (their errors are counted already)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- the threads ---------------------------------------------------------------------

    def _to_thread(self, entry: Entry[Any]) -> None:
        """Queue ``entry`` for a closing worker; once ended, retire it here."""
        with self._lock:
            queued = not self._ended
            if queued:
                self._queue.put(entry)
                self._free -= 1
                if self._free < 0 and self._workers < MOST_THREADS:
                    self._workers += 1
                    self._free += 1
                    self._start_thread(self._work)  # every worker is busy closing: one more
        if not queued:
            self.retire(entry)

    def _start_thread(self, target: Callable[..., None], *args: object) -> None:
        """Start a closing thread (under the lock); the first of a process life also
        registers the wait at interpreter exit."""
        if not self._threads:
            atexit.register(_at_exit, weakref.ref(self), os.getpid())
        thread = threading.Thread(
            target=target, args=args, name="orbit-clients-retire", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        while (entry := self._queue.get()) is not None:
            self._retire_quietly(entry)
            with self._lock:
                self._free += 1

    def _retire_each(self, entries: list[Entry[Any]]) -> None:
        for entry in entries:
            self._retire_quietly(entry)

    def _retire_quietly(self, entry: Entry[Any]) -> None:
        try:
            self.retire(entry)
        except BaseException:  # a close's SystemExit, say: no caller to reach here
            self._counters.close_errors += 1  # its budget returned, as after an Exception

    # -- the tasks -----------------------------------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` as a task of the running loop, kept referenced until done."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _closing(self, entry: Entry[Any]) -> asyncio.Task[None]:
        """A task of this loop that retires ``entry`` (a coroutine ``close``); a loop
        that ends first leaves it to a closing thread."""
        task = self._spawn(self._close_then_unregister(entry))
        task.add_done_callback(lambda done: self._after_closing(entry, done))
        return task

    async def _close_then_unregister(self, entry: Entry[Any]) -> None:
        try:
            await self.close_quietly_async(entry.client, entry.close)
        except BaseException as error:
            if not isinstance(error, asyncio.CancelledError):  # cancelled: _after_closing
                self._unregister(entry)  # a close that raised: the budget returns all the same
            raise
        self._unregister(entry)

    def _after_closing(self, entry: Entry[Any], done: asyncio.Task[None]) -> None:
        """A close that ended cancelled (the loop ending under it, as ``asyncio.run`` cancels
        the tasks left, or its own CancelledError) may have closed nothing: a closing
        thread closes the client, on a loop of its own, then unregisters it."""
        if done.cancelled():
            self._to_thread(entry)

    def _unregister(self, entry: Entry[Any]) -> None:
        self._counters.retired += 1
        self._ledger.unregister(entry)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _at_exit(retiring: weakref.ref[Retiring], pid: int) -> None:
    """Wait for a pool's queued closes as the interpreter exits (not in a forked child,
    which inherits the handler but not the threads)."""
    found = retiring()
    if found is not None and os.getpid() == pid:
        found.shut(EXIT_WAIT_S)
