"""Every lock the benchmark compares: orbitive's, and what users would pick instead.

A :class:`Contender` knows how to set itself up for ``keys`` keys in a
:class:`Workspace` and raises :class:`Skip` (with the reason) when its package,
server or orbitive module is missing. Every contender is driven through the same
``cycle(key_index)`` call, so the harness overhead is identical for each row.
``try`` contenders report ``False`` for a busy key; blocking ones always succeed.
"""

from __future__ import annotations

import fcntl
import importlib
import multiprocessing
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from orbitive import Fleet
from orbitive.lock import Acquired, LockKey, LockOwner, LockTable

from ._measure import Kind, Skip
from ._workspace import Prepared, Session, Workspace
from .readiness_wake import remove_fleet_files

#: Nodes per benchmark fleet: the runner, its own session and 8 workers fit.
FLEET_CAPACITY = 16
TTL_S = 30.0


@dataclass(frozen=True)
class Contender:
    """One row of the comparison.

    Attributes:
        name: the row label.
        kind: "orbitive", "alternative" or "floor" (the bare flock pair).
        prepare: builds the contender for ``keys`` keys; raises Skip.
        processes: takes part in the multi-process contention runs.
        gives_up: what it lacks next to a LockTable lease (for the report).
    """

    name: str
    kind: Kind
    prepare: Callable[[Workspace, int], Prepared]
    processes: bool
    gives_up: str


def need(module: str, hint: str = "pip install -e '.[bench]'") -> ModuleType:
    """Import ``module`` or raise Skip with the import error and ``hint``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise Skip(f"{module} not importable ({exc}); {hint}") from None


def _nothing() -> None:
    return None


# -- orbitive ------------------------------------------------------------------------------


def lock_table(ws: Workspace, keys: int) -> Prepared:
    """LockTable try_acquire + release; every process joins the fleet as its own node."""
    return _lock_table(ws, keys, blocking=False)


def lock_table_blocking(ws: Workspace, keys: int) -> Prepared:
    """LockTable wait_acquire + release_waking: the table's blocking form. A release that
    found waiters makes the next wait_acquire queue behind them (as the store does)."""
    return _lock_table(ws, keys, blocking=True)


def _lock_table(ws: Workspace, keys: int, *, blocking: bool) -> Prepared:
    name = ws.unique("bench")
    fleet = Fleet.join(name, FLEET_CAPACITY)
    table = LockTable(fleet)
    lock_keys = [LockKey("bench", f"key-{index}") for index in range(keys)]

    def open_session() -> Session:
        own_fleet = Fleet.join(name, FLEET_CAPACITY)
        own = LockTable(own_fleet)
        owner = LockOwner(f"bench-{os.getpid()}".encode())
        acquire, release = own.try_acquire, own.release
        wait_acquire, release_waking = own.wait_acquire, own.release_waking
        waiting = [0] * keys

        def pair(index: int) -> bool:
            got = acquire(lock_keys[index], owner, TTL_S)
            if type(got) is Acquired:
                release(got.lease)
                return True
            return False

        def blocking_pair(index: int) -> bool:
            got = wait_acquire(lock_keys[index], owner, TTL_S, 10.0, queue=waiting[index] > 0)
            if type(got) is not Acquired:
                return False
            waiting[index] = release_waking(got.lease)
            return True

        def close() -> None:
            own.close()
            own_fleet.close()

        return Session(blocking_pair if blocking else pair, close)

    def cleanup() -> None:
        table.unlink()
        table.close()
        fleet.close()
        remove_fleet_files(name)

    return Prepared(open_session, cleanup)


def _store(
    ws: Workspace, keys: int, url: str, cleanup: Callable[[], None], helper: bool
) -> Prepared:
    """Sessions whose cycle is ``try_lock`` + ``release``, or with ``helper`` the blocking
    ``with store.lock(name, ttl=30, timeout=10)`` users write (renewed in the background)."""
    store_module: Any = need("orbitive.store", hint="not in this checkout yet")
    names = [f"bench/key-{index}" for index in range(keys)]

    def open_session() -> Session:
        store = store_module.open_store(url)
        owner = f"bench-{os.getpid()}"
        try_lock, lock = store.try_lock, store.lock

        def pair(index: int) -> bool:
            held = try_lock(names[index], owner=owner, ttl=TTL_S)
            if held is None:
                return False
            held.release()
            return True

        def with_lock(index: int) -> bool:
            with lock(names[index], ttl=TTL_S, timeout=10.0):
                return True

        return Session(with_lock if helper else pair, store.close)

    return Prepared(open_session, cleanup)


def _store_engine(url: Callable[[Workspace], tuple[str, Callable[[], None]]], helper: bool) -> Any:
    def prepare(ws: Workspace, keys: int) -> Prepared:
        found, cleanup = url(ws)
        return _store(ws, keys, found, cleanup, helper)

    return prepare


def _sqlite_url(ws: Workspace) -> tuple[str, Callable[[], None]]:
    """A SQLite file in the workspace."""
    return f"sqlite://{ws.root / ws.unique('store')}.db", _nothing


def _shm_url(ws: Workspace) -> tuple[str, Callable[[], None]]:
    """The SHM lock table of a fresh fleet."""
    name = ws.unique("bstore")
    return f"shm://{name}", lambda: remove_fleet_files(name)


def _postgres_url(ws: Workspace) -> tuple[str, Callable[[], None]]:
    """The runner's PostgreSQL server."""
    need("psycopg", hint="pip install -e '.[postgres]'")
    url = ws.postgres().url
    _pg_connect(url).close()
    return url, _nothing


def _redis_url(ws: Workspace) -> tuple[str, Callable[[], None]]:
    """The runner's redis-server (the one redis-py Lock uses)."""
    need("redis")
    port = ws.redis().port
    return f"redis://127.0.0.1:{port}/0?prefix={ws.unique('bstore')}:", _nothing


#: The store contract over each engine: (row label, URL maker).
STORE_ENGINES: tuple[tuple[str, Callable[[Workspace], tuple[str, Callable[[], None]]]], ...] = (
    ("SHM", _shm_url),
    ("SQLite", _sqlite_url),
    ("PostgreSQL", _postgres_url),
    ("Redis", _redis_url),
)
#: What the row of an engine's blocking helper adds to the pair row's name.
HELPER_SUFFIX = ", with store.lock()"


# -- alternatives --------------------------------------------------------------------------


def flock_pair(ws: Workspace, keys: int) -> Prepared:
    """A bare fcntl.flock LOCK_EX + LOCK_UN on one open file per key: the floor."""
    paths = [ws.root / ws.unique("flock") for _ in range(keys)]
    for path in paths:
        path.touch()

    def open_session() -> Session:
        fds = [os.open(path, os.O_RDWR) for path in paths]
        flock, exclusive, unlock = fcntl.flock, fcntl.LOCK_EX, fcntl.LOCK_UN

        def cycle(index: int) -> bool:
            fd = fds[index]
            flock(fd, exclusive)
            flock(fd, unlock)
            return True

        def close() -> None:
            for fd in fds:
                os.close(fd)

        return Session(cycle, close)

    return Prepared(open_session, _nothing)


def _blocking(locks: Callable[[], list[Any]]) -> Callable[[], Session]:
    """Sessions over objects with acquire() and release() (built per process)."""

    def open_session() -> Session:
        built = locks()

        def cycle(index: int) -> bool:
            lock = built[index]
            lock.acquire()
            lock.release()
            return True

        return Session(cycle, _nothing)

    return open_session


def mp_lock(ws: Workspace, keys: int) -> Prepared:
    """multiprocessing.Lock (a POSIX semaphore), created before the workers fork."""
    context = multiprocessing.get_context("fork")
    locks = [context.Lock() for _ in range(keys)]
    return Prepared(_blocking(lambda: locks), _nothing)


def posix_semaphore(ws: Workspace, keys: int) -> Prepared:
    """A named posix_ipc.Semaphore with initial value 1 per key."""
    posix_ipc: Any = need("posix_ipc")
    names = [f"/{ws.unique('obsem')}" for _ in range(keys)]
    made = [posix_ipc.Semaphore(name, posix_ipc.O_CREX, initial_value=1) for name in names]

    def cleanup() -> None:
        for semaphore in made:
            semaphore.unlink()
            semaphore.close()

    return Prepared(_blocking(lambda: [posix_ipc.Semaphore(name) for name in names]), cleanup)


def _file_lock(
    module: str, make: Callable[[Any, str], Any]
) -> Callable[[Workspace, int], Prepared]:
    def prepare(ws: Workspace, keys: int) -> Prepared:
        package = need(module)
        paths = [str(ws.root / ws.unique(module)) for _ in range(keys)]
        return Prepared(_blocking(lambda: [make(package, path) for path in paths]), _nothing)

    return prepare


filelock = _file_lock("filelock", lambda package, path: package.FileLock(path))
portalocker = _file_lock("portalocker", lambda package, path: package.Lock(path))
fasteners = _file_lock("fasteners", lambda package, path: package.InterProcessLock(path))


def redis_lock(ws: Workspace, keys: int) -> Prepared:
    """redis-py Lock (SET NX PX + a Lua release) against the runner's redis-server."""
    redis: Any = need("redis")
    port = ws.redis().port
    prefix = ws.unique("bench")

    def open_session() -> Session:
        client = redis.Redis(host="127.0.0.1", port=port)
        locks = [client.lock(f"{prefix}:{index}", timeout=TTL_S) for index in range(keys)]

        def cycle(index: int) -> bool:
            lock = locks[index]
            if not lock.acquire(blocking=False):
                return False
            lock.release()
            return True

        return Session(cycle, client.close)

    return Prepared(open_session, _nothing)


def _pg_connect(url: str) -> Any:
    """A psycopg autocommit connection, retried while the server is still starting."""
    psycopg: Any = need("psycopg", hint="pip install -e '.[postgres]'")
    deadline = time.monotonic() + 30.0
    while True:
        try:
            return psycopg.connect(url, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as exc:
            if time.monotonic() > deadline:
                raise Skip(f"PostgreSQL not reachable: {exc}") from None
            time.sleep(0.1)


def pg_advisory(ws: Workspace, keys: int) -> Prepared:
    """pg_try_advisory_lock + pg_advisory_unlock on one autocommit connection."""
    url = ws.postgres().url
    _pg_connect(url).close()

    def open_session() -> Session:
        connection = _pg_connect(url)
        execute = connection.execute

        def cycle(index: int) -> bool:
            if not execute("SELECT pg_try_advisory_lock(%s)", (index,)).fetchone()[0]:
                return False
            execute("SELECT pg_advisory_unlock(%s)", (index,))
            return True

        return Session(cycle, connection.close)

    return Prepared(open_session, _nothing)


_FLOCK_BASED = "no TTL, no owner check, no fencing; the kernel drops it on a crash"
_NO_RECOVERY = "no TTL, no owner check, no fencing, no crash recovery (kill -9 leaves it taken)"

CONTENDERS: tuple[Contender, ...] = (
    Contender("orbitive LockTable", "orbitive", lock_table, False, ""),
    Contender("orbitive LockTable.wait_acquire", "orbitive", lock_table_blocking, True, ""),
    *(
        Contender(
            f"orbitive store: {engine}{suffix}", "orbitive", _store_engine(url, helper), False, ""
        )
        for engine, url in STORE_ENGINES
        for suffix, helper in (("", False), (HELPER_SUFFIX, True))
    ),
    Contender("fcntl.flock pair", "floor", flock_pair, True, _FLOCK_BASED),
    Contender("multiprocessing.Lock", "alternative", mp_lock, True, _NO_RECOVERY),
    Contender("posix_ipc.Semaphore", "alternative", posix_semaphore, True, _NO_RECOVERY),
    Contender("filelock.FileLock", "alternative", filelock, True, _FLOCK_BASED),
    Contender("portalocker.Lock", "alternative", portalocker, True, _FLOCK_BASED),
    Contender("fasteners.InterProcessLock", "alternative", fasteners, True, _FLOCK_BASED),
    Contender(
        "redis-py Lock",
        "alternative",
        redis_lock,
        False,
        "TTL and owner token, but no fencing token; a server round trip per call",
    ),
    Contender(
        "PostgreSQL advisory lock",
        "alternative",
        pg_advisory,
        False,
        "no TTL, no fencing; freed when the session ends; a server round trip per call",
    ),
)
