"""Wake-ups for semaphore waiters: one listening connection per engine, shared by every
waiter of the process, sync or asyncio.

The PostgreSQL engine (``LISTEN``/``NOTIFY``) and the Redis engine (a Pub/Sub
channel) hear when units of a semaphore are released: the release commits and
the server sends the semaphore's name to every listener. The engine is the
:class:`Channel`; :class:`Notifications` runs it and wakes the waiters of that
name.

Facts the waiters rely on:

* One daemon thread per engine owns the listening connection. It starts with
  the first waiter, and ends once no waiter has been left for :data:`IDLE_S`
  seconds, or when the engine closes.
* A waiter subscribes before its first attempt. Once the thread listens it wakes
  every waiter (a release before that went unheard), so a release that commits
  after a waiter's attempt always wakes it: by its notification, or by the wake
  that starts the listening. A waiter is woken once per notification, however
  many arrive before it waits again.
* A connection that breaks, or fails to connect, wakes every waiter (a
  notification may have been missed) and is made again after a pause that
  doubles up to one second. While the thread does not listen, the waiters pause
  at most the engine's own ``poll_cap_s``; while it listens, at most
  :data:`LISTENING_CAP_S`.
* A lapse sends nothing: a waiter never pauses past the expiry of the holder
  that ends first (``_lock.next_pause``).
* asyncio waiters are woken on their own loop (``call_soon_threadsafe``).
* A forked child starts with no thread and no waiters of its own; its engine
  drops the inherited listening connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Final, Protocol

from .._core import _fork

#: Longest pause of a waiter between attempts while the thread listens, in seconds.
LISTENING_CAP_S: Final = 1.0
#: The thread ends after this many seconds without a waiter.
IDLE_S: Final = 10.0
#: Longest wait for notifications in one receive, in seconds (how soon the thread
#: notices it should stop).
RECEIVE_S: Final = 0.25
#: First and longest pause before the thread connects again, in seconds.
_RETRY_FIRST_S: Final = 0.05
_RETRY_MAX_S: Final = 1.0


class Channel(Protocol):
    """An engine's listening connection, used only by the thread of its :class:`Notifications`."""

    def listen(self) -> None:
        """Connect and subscribe to the notifications of released units.

        Raises:
            Exception: the driver's error when the server cannot be reached.
        """

    def receive(self, timeout: float) -> list[str]:
        """The semaphore names notified, waiting up to ``timeout`` seconds for the first.

        Raises:
            Exception: the driver's error when the connection broke.
        """

    def hang_up(self) -> None:
        """Close the listening connection; idempotent."""


class Notifications:
    """Wakes this process's waiters of a semaphore when its units are released.

    Args:
        channel: the engine's listening connection.
    """

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._mutex = threading.Lock()  # guards everything below, and each Subscription's futures
        self._waiters: dict[str, set[Subscription]] = {}
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None
        self._idle_since = time.monotonic()
        self._closed = False
        _fork.register(self)

    @property
    def listening(self) -> bool:
        """True while the thread holds a subscribed connection."""
        return self._listening.is_set()

    def subscribe(self, name: str) -> Subscription:
        """Wake-ups for a waiter of ``name``; call before its first attempt, close after.

        Never blocks: it starts the thread if none runs.
        """
        subscription = Subscription(self, name)
        with self._mutex:
            self._waiters.setdefault(name, set()).add(subscription)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="orbitive-semaphore-listener", daemon=True
                )
                self._thread.start()
        return subscription

    def _leave(self, subscription: Subscription) -> None:
        with self._mutex:
            found = self._waiters.get(subscription.name)
            if found is None:
                return
            found.discard(subscription)
            if not found:
                del self._waiters[subscription.name]
                if not self._waiters:
                    self._idle_since = time.monotonic()

    def _wake(self, names: list[str] | None) -> None:
        """Wake the waiters of ``names`` (None: every waiter)."""
        with self._mutex:
            if names is None:
                chosen = list(self._waiters.values())
            else:
                chosen = [self._waiters[name] for name in names if name in self._waiters]
            for subscriptions in chosen:
                for subscription in subscriptions:
                    subscription._fire()

    def _wanted(self) -> bool:
        """True while the thread should listen: the engine is open and a waiter is left,
        or was until less than :data:`IDLE_S` seconds ago."""
        return not self._closed and (
            bool(self._waiters) or time.monotonic() - self._idle_since <= IDLE_S
        )

    def _run(self) -> None:
        pause = _RETRY_FIRST_S
        while True:
            with self._mutex:  # decided under the mutex: a new waiter then starts a thread
                if not self._wanted():
                    self._thread = None
                    return
            try:
                self._channel.listen()
            except Exception:  # any failure to connect: waiters poll meanwhile, retry later
                self._channel.hang_up()
                time.sleep(pause)
                pause = min(pause * 2.0, _RETRY_MAX_S)
                continue
            pause = _RETRY_FIRST_S
            self._listening.set()
            self._wake(None)  # a release before the thread listened went unheard
            try:
                while self._wanted():
                    names = self._channel.receive(RECEIVE_S)
                    if names:
                        self._wake(names)
            except Exception:  # the connection broke: connect again
                pass
            finally:
                self._listening.clear()
                self._channel.hang_up()
                self._wake(None)

    def close(self) -> None:
        """Stop the thread (it hangs up within :data:`RECEIVE_S`) and wake every waiter."""
        with self._mutex:
            self._closed = True
            thread = self._thread
        self._wake(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(2.0 * RECEIVE_S)

    def _after_fork_in_child(self) -> None:
        self._mutex = threading.Lock()
        self._waiters = {}
        self._listening = threading.Event()
        self._thread = None
        self._idle_since = time.monotonic()


class Subscription:
    """A waiter's wake-ups for one semaphore name; a context manager that leaves on exit.

    :meth:`arm` before each attempt, then :meth:`wait` (or :meth:`wait_async`): a
    release notified after :meth:`arm` ends the wait at once.
    """

    __slots__ = ("_futures", "_hub", "_woken", "name")

    def __init__(self, hub: Notifications, name: str) -> None:
        self._hub = hub
        self.name = name
        self._woken = threading.Event()
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def cap_s(self) -> float | None:
        """Longest pause between attempts while notifications arrive; None while they do not."""
        return LISTENING_CAP_S if self._hub.listening else None

    def arm(self) -> None:
        """Forget earlier wake-ups: the next wait ends at the next notification."""
        self._woken.clear()

    def wait(self, delay: float) -> None:
        """Block until a notification since :meth:`arm`, or ``delay`` seconds."""
        self._woken.wait(max(delay, 0.0))

    async def wait_async(self, delay: float) -> None:
        """:meth:`wait` for asyncio code: the loop is never blocked."""
        if self._woken.is_set():
            return
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        entry = (loop, woken)
        with self._hub._mutex:
            self._futures.append(entry)
        if self._woken.is_set():  # fired before the future was registered
            _wake(woken)
        timer = loop.call_later(max(delay, 0.0), _wake, woken)
        try:
            await woken
        finally:
            timer.cancel()
            with self._hub._mutex:
                self._futures.remove(entry)

    def _fire(self) -> None:
        """Wake this waiter (the hub's mutex is held)."""
        self._woken.set()
        for loop, woken in self._futures:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody awaits it any more
                loop.call_soon_threadsafe(_wake, woken)

    def close(self) -> None:
        """Stop receiving wake-ups; idempotent."""
        self._hub._leave(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)
