"""Run-once Celery tasks on the named-lock store: the task base class :class:`Singleton`.

``@app.task(base=Singleton, unique_on=["user_id"], ttl=60.0)`` makes a task of which one
call per key (the task's name and the chosen arguments) runs at a time, on any store
URL (``shm://``, ``sqlite://``, ``postgresql://``, ``redis://``). See docs/celery.md.

Three lock names per key, all in the store (``celery/<task>/<digest>`` and two
siblings):

* the **run lock** (the key itself), taken by the worker process that runs the task,
  owner ``"<task id> <host>:<pid>:<random>"``, renewed every ``ttl / 3`` by orbitive's
  renewer and released when the body ends however it ends;
* the **queue marker** (``.../queued``), taken by the caller at ``apply_async`` in
  ``"queue"`` mode, owner ``"<task id>"``, for ``queue_ttl`` seconds; the worker
  removes it once it holds the run lock, and a message that is lost leaves it to
  lapse after ``queue_ttl``;
* the **cool-down** (``.../cooldown``), taken after a success when ``cooldown > 0``.

A caller in ``"queue"`` mode looks at the run lock and the cool-down first, and takes
the marker only when both are free; a worker takes the run lock before it removes the
marker, so a call made while another is queued or running finds one of them held.
A caller that holds the marker always sends its message (or, when the send fails,
stores the failure as the task's result): the marker's owner, which duplicates are
handed, is a task whose result comes. A caller that took the marker just as a queued
call started running is queued behind it: its worker waits for the run lock.

This module imports Celery; the rest of orbitive never does (extra ``orbitive[celery]``).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final

from celery import Task
from celery.exceptions import Ignore
from celery.result import AsyncResult
from celery.signals import task_revoked

from .store import Lock, LockTimeout, Store, StoreError, open_store

__all__ = ["DuplicateTask", "InvalidSingletonOptions", "Singleton"]

_log = logging.getLogger("orbitive.celery")

#: The modes of :attr:`Singleton.lock_mode`.
MODES: Final = ("queue", "skip", "wait")
#: The values of :attr:`Singleton.on_store_error`.
STORE_ERROR_POLICIES: Final = ("closed", "open")
#: The request attribute the run lock is kept in while the body runs.
_REQUEST_LOCK: Final = "orbitive_lock"
#: A lock name longer than this many bytes has its task part hashed (the limit is 255).
_NAME_ROOM: Final = 200


class DuplicateTask(Exception):
    """A call refused because the same task with the same key is queued, running or
    cooling down (``"queue"`` mode with ``raise_on_duplicate=True``).

    Attributes:
        task_id: the id of the task that holds the key (a ``str``).
        lock_name: the store name of the key (a ``str``).
    """

    def __init__(self, task_id: str, lock_name: str) -> None:
        super().__init__(f"task {task_id} already holds {lock_name!r}")
        self.task_id = task_id
        self.lock_name = lock_name

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.task_id, self.lock_name))


class InvalidSingletonOptions(ValueError):
    """A :class:`Singleton` task's options are wrong (an unknown mode, a ``unique_on``
    name the task does not take, a ttl that is not a positive number)."""


# -- the stores of this process -----------------------------------------------------------

_stores: dict[str, Store] = {}
_stores_mutex = threading.Lock()


def _store(url: str | None) -> Store:
    """This process's store of ``url`` (None: open_store's default), opened once.

    Raises:
        InvalidStoreUrl: a URL open_store refuses.
        StoreError: ``UNAVAILABLE`` when the engine cannot be reached.
    """
    key = url or ""
    with _stores_mutex:
        store = _stores.get(key)
        if store is None:
            store = open_store(url) if url else open_store()
            _stores[key] = store
        return store


# -- keys ----------------------------------------------------------------------------------


def _task_of(owner: str) -> str:
    """The task id an owner string of this module names (its first word)."""
    return owner.split(" ", 1)[0]


if TYPE_CHECKING:  # Task is generic in celery-types, not at run time in every release
    _TaskBase = Task[Any, Any]
else:
    _TaskBase = Task


def _died_here(owner: str) -> bool:
    """Whether the run lock's ``owner`` names a process of this host that no longer exists."""
    host_pid = owner.partition(" ")[2].rsplit(":", 2)
    if len(host_pid) != 3 or host_pid[0] != socket.gethostname() or not host_pid[1].isdigit():
        return False
    try:
        os.kill(int(host_pid[1]), 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists (another user's), or cannot be told
        return False
    return False


def _encode(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)


class Singleton(_TaskBase):
    """A task base class: one call per key runs at a time.

    Use as ``@app.task(base=Singleton, unique_on=[...], ttl=60.0)``; each option below
    is also a keyword of ``app.task``. The key is the task's name and the values of
    the ``unique_on`` arguments, bound to the task's signature (so ``f(1, b=2)`` and
    ``f(a=1, b=2)`` are one key, and defaults count), JSON-encoded (``repr`` for other
    values).

    Attributes:
        unique_on: argument names the key is made of (a sequence of ``str``); None
            (the default): every argument; ``[]``: the task name alone.
        lock_mode: ``"queue"`` (default): ``apply_async`` refuses a call while the key
            is queued, running or cooling down, and returns the holder's
            ``AsyncResult`` (or raises :class:`DuplicateTask` with
            ``raise_on_duplicate``); ``"skip"``: every call is queued, and one that
            finds the key held when it starts returns None without running;
            ``"wait"``: a call that finds the key held waits for it at start (at most
            ``wait_timeout`` seconds, then ``LockTimeout`` fails the task).
        ttl: the run lock's lease in seconds (float); renewed every ``ttl / 3`` while
            the body runs, so it bounds how long a killed process keeps the key.
        queue_ttl: seconds (float) the queue marker taken at ``apply_async`` lives
            while the message waits for a worker (``"queue"`` mode). A message lost
            on the way leaves the key refused until it lapses; a message that waits
            longer than this is no longer protected (a second call may queue).
        wait_timeout: ``"wait"`` mode: seconds (float) a call waits at start; None
            waits as long as it takes. Also how long a ``"queue"`` call waits at start
            for a run that began as it was queued.
        cooldown: seconds (float) the key stays refused after a success (0: none).
        raise_on_duplicate: ``"queue"`` mode: raise :class:`DuplicateTask` instead of
            returning the holder's ``AsyncResult``.
        on_store_error: ``"closed"`` (default): a store that cannot be reached makes
            ``apply_async`` raise, and the task fail at start, with the store's
            ``StoreError`` (kind ``UNAVAILABLE``); nothing runs unlocked.
            ``"open"``: log a warning and run without the lock (duplicates possible).
        store_url: the store (``shm://``, ``sqlite://``, ``postgresql://``,
            ``redis://``); None: the app setting ``orbitive_store_url``, else
            :func:`orbitive.store.open_store`'s default (a SQLite file of this user:
            one host only).
        lock_prefix: the first part of every lock name (``str``, default ``"celery"``).
    """

    abstract = True
    unique_on: ClassVar[Sequence[str] | None] = None
    lock_mode: ClassVar[str] = "queue"
    ttl: ClassVar[float] = 60.0
    queue_ttl: ClassVar[float] = 3600.0
    wait_timeout: ClassVar[float | None] = None
    cooldown: ClassVar[float] = 0.0
    raise_on_duplicate: ClassVar[bool] = False
    on_store_error: ClassVar[str] = "closed"
    store_url: ClassVar[str | None] = None
    lock_prefix: ClassVar[str] = "celery"

    # -- what the body reads ------------------------------------------------------------

    @property
    def held_lock(self) -> Lock | None:
        """The run lock of the call being executed (a :class:`orbitive.store.Lock`), or
        None outside a run or when it runs unlocked (``on_store_error="open"``)."""
        lock = getattr(self.request, _REQUEST_LOCK, None)
        return lock if isinstance(lock, Lock) else None

    @property
    def lock_token(self) -> int | None:
        """The fencing token (``int``) of the run lock of the call being executed: larger
        than that of every earlier run of the key; None as :attr:`held_lock` is None."""
        lock = self.held_lock
        return None if lock is None else lock.fencing_token

    # -- keys ----------------------------------------------------------------------------

    def lock_name(
        self, args: Sequence[Any] | None = None, kwargs: dict[str, Any] | None = None
    ) -> str:
        """The store name of the run lock of a call with ``args`` and ``kwargs``.

        Args:
            args: the positional arguments (a sequence; None: none).
            kwargs: the keyword arguments (a dict; None: none).

        Returns:
            ``"<lock_prefix>/<task name>/<sha256 of the key, 32 hex digits>"`` (a ``str``;
            the task name is hashed too when the whole would pass 200 bytes).

        Raises:
            TypeError: the arguments do not bind to the task's signature.
            InvalidSingletonOptions: ``unique_on`` names an argument the task does
                not take.
        """
        bound = inspect.signature(self.run).bind(*(args or ()), **(kwargs or {}))
        bound.apply_defaults()
        values = bound.arguments
        chosen = values if self.unique_on is None else self._chosen(values)
        digest = hashlib.sha256(_encode(chosen).encode()).hexdigest()[:32]
        name = f"{self.lock_prefix}/{self.name}/{digest}"
        if len(name.encode()) > _NAME_ROOM:
            task = hashlib.sha256(str(self.name).encode()).hexdigest()[:32]
            name = f"{self.lock_prefix}/{task}/{digest}"
        return name

    def _chosen(self, values: dict[str, Any]) -> dict[str, Any]:
        unknown = [name for name in self.unique_on or () if name not in values]
        if unknown:
            raise InvalidSingletonOptions(
                f"task {self.name}: unique_on names {unknown!r}, which it does not take"
                f" (its arguments: {list(values)!r})"
            )
        return {name: values[name] for name in self.unique_on or ()}

    def _checked(self) -> None:
        """Raise InvalidSingletonOptions for options no call can use."""
        if self.lock_mode not in MODES:
            raise InvalidSingletonOptions(f"task {self.name}: lock_mode must be one of {MODES}")
        if self.on_store_error not in STORE_ERROR_POLICIES:
            raise InvalidSingletonOptions(
                f"task {self.name}: on_store_error must be one of {STORE_ERROR_POLICIES}"
            )
        for option in ("ttl", "queue_ttl"):
            value = getattr(self, option)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise InvalidSingletonOptions(
                    f"task {self.name}: {option} must be a positive number of seconds"
                )

    def _store(self) -> Store:
        url = self.store_url or self.app.conf.get("orbitive_store_url")
        return _store(url)

    # -- the caller's side ---------------------------------------------------------------

    def apply_async(
        self,
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **options: Any,
    ) -> AsyncResult[Any]:
        """Send the task, unless (``"queue"`` mode) its key is queued, running or cooling
        down: then return the holder's ``AsyncResult`` (or raise).

        In ``"skip"`` and ``"wait"`` modes this is Celery's own, but for a retry sent
        from the running body (``self.retry()``), which takes the queue marker for its
        task id as in ``"queue"`` mode: the worker that gets the retry's message while
        the body still holds the run lock waits for it, rather than ignoring the
        message as a second delivery.

        Args:
            args: the positional arguments (a tuple; None: none).
            kwargs: the keyword arguments (a dict; None: none).
            task_id: the new task's id (a ``str``; None: a fresh UUID). A retry sends
                its own id again, and is let through while that id holds the key.
            producer: as Celery's ``Task.apply_async`` (a kombu producer, or None).
            link: as Celery's (a signature, or a list of them, called on success).
            link_error: as Celery's (a signature, or a list, called on failure).
            shadow: as Celery's (a ``str``: the name shown in logs, or None).
            **options: as Celery's (``countdown`` and ``eta``, ``queue``, ...).

        Returns:
            The ``AsyncResult`` of this call, or of the task that holds the key.

        Raises:
            DuplicateTask: the key is held and ``raise_on_duplicate`` is set.
            InvalidSingletonOptions: bad options, or ``unique_on`` names an argument
                the task does not take.
            TypeError: the arguments do not bind to the task's signature.
            StoreError: the store cannot be reached (kind ``UNAVAILABLE``) with
                ``on_store_error="closed"``.
            Exception: whatever Celery's ``apply_async`` raises (a broker that cannot
                be reached); the task's result is then stored as that FAILURE, for
                the duplicates handed its id, and the queue marker is given back.
        """
        self._checked()
        retry = task_id is not None and task_id == self.request.id and self.held_lock is not None
        if self.lock_mode != "queue" and not retry:
            return super().apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow, **options
            )
        task_id = task_id or str(uuid.uuid4())
        name = self.lock_name(args, kwargs)
        try:
            if self.lock_mode == "queue":
                marker, holder = self._queue(name, task_id)
            else:  # a retry from the body: marks its message as the holder's own
                marker = self._store().try_lock(f"{name}/queued", task_id, self.queue_ttl)
                holder = None
        except StoreError:
            if self.on_store_error == "closed":
                raise
            _log.warning("task %s[%s]: store unreachable; sent unlocked", self.name, task_id)
            marker, holder = None, None
        if holder is not None:
            if self.raise_on_duplicate:
                raise DuplicateTask(holder, name)
            return self.AsyncResult(holder)
        try:
            return super().apply_async(
                args, kwargs, task_id, producer, link, link_error, shadow, **options
            )
        except BaseException as error:
            if marker is not None:
                self._unsent(task_id, marker, error)
            raise

    def _queue(self, name: str, task_id: str) -> tuple[Lock | None, str | None]:
        """Take the queue marker for ``task_id``: (the marker, None), or (None, the id of
        the task that holds the key).

        The run lock and the cool-down are looked at before the marker is taken, and a
        marker once taken is kept: its owner is handed to every duplicate, so it must
        be a task that is sent. (Taking the marker first and giving it back on finding
        the key running let a duplicate read the owner of a marker about to be given
        back, and wait for a task never sent.)

        Raises:
            StoreError: the store cannot be reached, or the marker changed hands 100
                times in a row.
        """
        store = self._store()
        for _ in range(100):  # a holder seen busy, then gone: ask again
            holder = store.inspect(name) or store.inspect(f"{name}/cooldown")
            if holder is not None and _task_of(holder.owner) != task_id:  # same id: a retry
                return None, _task_of(holder.owner)
            marker = store.try_lock(f"{name}/queued", task_id, self.queue_ttl)
            if marker is not None:
                return marker, None
            seen = store.inspect(f"{name}/queued")
            if seen is not None:
                return None, _task_of(seen.owner)
        raise StoreError(f"lock {name!r}: the queue marker changed hands 100 times in a row")

    def _unsent(self, task_id: str, marker: Lock, error: BaseException) -> None:
        """The message of ``task_id``, which holds ``marker``, could not be sent: store
        ``error`` as its result (FAILURE), for the duplicates handed its id meanwhile,
        then give the marker back. A backend that fails too is logged, not raised."""
        try:
            if isinstance(error, Exception):
                self.backend.mark_as_failure(task_id, error)
        except Exception:
            _log.warning(
                "task %s[%s]: not sent, and its failure not stored", self.name, task_id,
                exc_info=True,
            )  # fmt: skip
        finally:
            marker.release()

    # -- the worker's side ---------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the body under the key's run lock (a worker's call); a plain function call
        of the task (``task(...)``) takes no lock.

        Returns:
            What the body returns; None when the call is skipped (``"skip"`` mode, or
            a cool-down).

        Raises:
            celery.exceptions.Ignore: this very task id already runs elsewhere (a
                redelivered message): the copy neither runs nor records a state.
            LockTimeout: ``"wait"`` mode (or ``"queue"``, a call queued as another
                started), still held after ``wait_timeout`` seconds.
            StoreError: the store cannot be reached, with ``on_store_error="closed"``.
            InvalidSingletonOptions: bad options.
            Exception: whatever the body raises (the lock is released first).
        """
        request = self.request
        if request.called_directly or not request.id:
            return super().__call__(*args, **kwargs)
        self._checked()
        task_id = str(request.id)
        name = self.lock_name(args, kwargs)
        try:
            lock = self._take(name, task_id)
        except StoreError:
            if self.on_store_error == "closed":
                raise
            _log.warning("task %s[%s]: store unreachable; running unlocked", self.name, task_id)
            return self.run(*args, **kwargs)
        if lock is None:
            return None
        setattr(request, _REQUEST_LOCK, lock)
        succeeded = False
        try:
            result = self.run(*args, **kwargs)
            succeeded = True
            return result
        finally:
            setattr(request, _REQUEST_LOCK, None)
            self._end(name, task_id, lock, succeeded)

    def _take(self, name: str, task_id: str) -> Lock | None:
        """The run lock for ``task_id``, or None when this call is to be skipped."""
        store = self._store()
        owner = f"{task_id} {socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
        lock: Lock | None
        try:
            lock = store.lock(name, owner, self.ttl, 0.0)
        except LockTimeout:
            lock = self._wait_or_skip(store, name, task_id, owner)
        if lock is None:
            return None
        try:
            cooling = store.inspect(f"{name}/cooldown")
            if cooling is not None and _task_of(cooling.owner) != task_id:
                _log.info("task %s[%s]: %r cools down; skipped", self.name, task_id, name)
                lock.release()
                return None
            queued = store.inspect(f"{name}/queued")
            if queued is not None and queued.owner == task_id:
                store.force_release(f"{name}/queued")
        except BaseException:
            lock.release()
            raise
        return lock

    def _wait_or_skip(self, store: Store, name: str, task_id: str, owner: str) -> Lock | None:
        """The key was held at the first attempt: the run lock after waiting (``"wait"``
        and ``"queue"`` modes), or None (``"skip"``).

        A holder of this very task id is a run whose message came again (ignored, unless
        its process died on this host: its lease is waited out), or the run that sent
        this message as its retry, which took the queue marker for it: waited for.

        Raises:
            celery.exceptions.Ignore: the holder is this task id, alive elsewhere, and
                did not send this message as its retry.
            LockTimeout: still held after ``wait_timeout`` seconds.
        """
        holder = store.inspect(name)
        if holder is not None and _task_of(holder.owner) == task_id:
            queued = store.inspect(f"{name}/queued")
            if queued is not None and queued.owner == task_id and not self.request.is_eager:
                # the retry the running holder sent (it took the marker for its id again):
                # the holder is ending; run once it has
                return store.lock(name, owner, self.ttl, self.wait_timeout)
            if not _died_here(holder.owner):
                _log.warning(
                    "task %s[%s] already runs (%s): this copy is ignored",
                    self.name, task_id, holder.owner,
                )  # fmt: skip
                raise Ignore()
            # a redelivery of a run whose process died on this host: wait out its lease
            return store.lock(name, owner, self.ttl, holder.remaining_s + 1.0)
        if self.lock_mode != "skip":  # "queue": a call queued as another started runs after it
            return store.lock(name, owner, self.ttl, self.wait_timeout)
        _log.info("task %s[%s]: %r is held; skipped", self.name, task_id, name)
        return None

    def _end(self, name: str, task_id: str, lock: Lock, succeeded: bool) -> None:
        """Take the cool-down (after a success), then release the run lock; a store that
        cannot be reached is logged, not raised (the run is over; the lease lapses)."""
        try:
            if succeeded and self.cooldown > 0:
                self._store().try_lock(f"{name}/cooldown", task_id, self.cooldown)
        except StoreError:
            _log.warning(
                "task %s[%s]: no cool-down for %r", self.name, task_id, name, exc_info=True
            )
        try:
            lock.release()
        except StoreError:
            _log.warning("task %s[%s]: could not release %r; it lapses at its TTL",
                         self.name, task_id, name, exc_info=True)  # fmt: skip


@task_revoked.connect
def _on_revoked(
    sender: Any = None, request: Any = None, terminated: bool = False, **_: Any
) -> None:
    """In the worker's main process: a revoked task's queue marker is removed, and,
    when it was terminated (by a signal its process may not have caught), its run lock.
    """
    task_id = getattr(request, "id", None)
    if not isinstance(sender, Singleton) or not task_id:
        return
    try:
        store = sender._store()
        for seen in store.locks():
            if not seen.name.startswith(f"{sender.lock_prefix}/"):
                continue
            if (seen.name.endswith("/queued") and seen.owner == task_id) or (
                terminated and seen.owner.startswith(f"{task_id} ")
            ):
                store.force_release(seen.name)
    except Exception:
        _log.warning("could not free the key of revoked task %s", task_id, exc_info=True)
