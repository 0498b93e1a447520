"""Pool rows: local reuse, remote reuse over a Unix socket, acquire under 8 processes, wake.

orbitive.pool is imported at run time: a checkout without it gets one skipped
row with the reason. Every process builds its own :class:`Pool` on its own
fleet node and registers one exclusive resource under one shared key, so
``LocalFirst`` reuses the caller's own resource (local reuse) unless the caller
owns none (remote reuse: the lease travels to the owner over a socketpair).
"""

from __future__ import annotations

import functools
import mmap
import os
import selectors
import socket
import struct
import time
from collections.abc import Callable
from multiprocessing import get_context
from multiprocessing.connection import Connection
from typing import Any

from orbitive import Fleet

from . import _wake
from ._contenders import FLEET_CAPACITY, need
from ._contention import record, run_round
from ._measure import Result, Settings, Skip, Unit, calibrated_us
from ._wake import latency
from ._workspace import Prepared, Session, Workspace
from .placement import PLACEMENTS, placed
from .readiness_wake import remove_fleet_files

SECTION = "pool"
_KEY = 0x0B1E_5EED
_STAMP = struct.Struct("<Q")


class _Pools:
    """The pool module, one fleet name, and a pool the runner keeps open until cleanup."""

    def __init__(self, ws: Workspace) -> None:
        self.module: Any = need("orbitive.pool", hint="not in this checkout yet")
        self.session: Any = need("orbitive.pool.session", hint="not in this checkout yet")
        self.name = ws.unique("bpool")
        self.key = self.module.Key(_KEY)
        self.limits = self.module.Limits(max_live=FLEET_CAPACITY, attempts=4)
        self.policy = self.module.LocalFirst()
        self._fleet = Fleet.join(self.name, FLEET_CAPACITY)
        self._pool = self.module.Pool(self._fleet)

    def join(self) -> tuple[Fleet, Any]:
        """A new node of the fleet and a Pool on it (in the calling process)."""
        fleet = Fleet.join(self.name, FLEET_CAPACITY)
        return fleet, self.module.Pool(fleet)

    def local_reuse(self) -> Prepared:
        """Sessions whose cycle is acquire (LocalReuse) + accept + complete."""
        return Prepared(self._open_local, lambda: None)

    def reuse_cycle(self) -> Session:
        """A session whose cycle is issue 4's local reuse: reserve + accept + complete."""
        pool, rid, close = self._own_resource()
        reserve, accept = pool.reserve, pool.accept

        def cycle(_: int) -> bool:
            accept(reserve(rid)).complete()
            return True

        return Session(cycle, close)

    def _open_local(self) -> Session:
        pool, _, close = self._own_resource()
        acquire, accept, local = pool.acquire, pool.accept, self.module.LocalReuse
        key, limits, policy = self.key, self.limits, self.policy

        def cycle(_: int) -> bool:
            plan = acquire(key, limits, policy)
            if type(plan) is not local:
                if type(plan) is self.module.RemoteReuse:
                    pool.cancel_reservation(plan.lease)
                return False
            accept(plan.lease).complete()
            return True

        return Session(cycle, close)

    def _own_resource(self) -> tuple[Any, Any, Callable[[], None]]:
        """A new node with a Pool owning one exclusive resource: (pool, id, close)."""
        fleet, pool = self.join()
        rid = pool.register(self.key, 1)

        def close() -> None:
            pool.unregister(rid)
            pool.close()
            fleet.close()

        return pool, rid, close

    def close(self) -> None:
        self._pool.unlink()
        self._pool.close()
        self._fleet.close()
        remove_fleet_files(self.name)


#: The remote-reuse payload, each way (issue 4: a 128-byte payload).
PAYLOAD = bytes(range(128))


def _owner(pools: _Pools, sock: socket.socket, borrower: socket.socket) -> None:
    """A forked resource owner: accept each session frame, complete, echo its payload."""
    borrower.close()  # the fork's copy: the borrower's close must reach us as an EOF
    fleet, pool = pools.join()
    rid = pool.register(pools.key, 1)
    sock.sendall(b"r")
    while True:
        try:
            execution = pools.session.accept_session(pool, sock)
        except pools.session.SessionClosed:
            break  # the client closed its end
        payload = sock.recv(len(PAYLOAD), socket.MSG_WAITALL)
        execution.complete()  # before the reply: the borrower reserves again at once
        sock.sendall(payload)
    pool.unregister(rid)  # the next placement's borrower finds one candidate
    pool.close()
    fleet.close()
    os._exit(0)


def remote_reuse(pools: _Pools, settings: Settings, one_cpu: bool) -> list[float]:
    """Round trips per second: reserve, lease frame + 128 B, owner accepts, echoes, completes."""
    with placed(one_cpu):
        return _remote_reuse(pools, settings)


def _remote_reuse(pools: _Pools, settings: Settings) -> list[float]:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    owner = get_context("fork").Process(target=_owner, args=(pools, theirs, mine), daemon=True)
    owner.start()
    theirs.close()
    fleet, pool = pools.join()
    try:
        if mine.recv(1) != b"r":
            raise Skip("the pool owner process did not start")
        (candidate,) = pool.candidates(pools.key)
        reserve, open_session, rid = pool.reserve, pools.session.open_session, candidate.id

        def cycle(_: int) -> bool:
            open_session(reserve(rid), mine, PAYLOAD)
            return mine.recv(len(PAYLOAD), socket.MSG_WAITALL) == PAYLOAD

        samples = calibrated_us(cycle, settings.seconds, settings.repeats)
    finally:
        mine.close()
        owner.join(10)
        pool.close()
        fleet.close()
    return [1e6 / sample for sample in samples]


def _echo(sock: socket.socket, borrower: socket.socket) -> None:
    """A forked peer that answers every frame-sized request with its payload."""
    borrower.close()  # as in _owner
    request = len(PAYLOAD) + pool_frame_size()
    while data := sock.recv(request, socket.MSG_WAITALL):
        sock.sendall(data[-len(PAYLOAD) :])
    os._exit(0)


def pool_frame_size() -> int:
    """Bytes of the pool's session frame (48), read from the session module."""
    from orbitive.pool.session import FRAME_SIZE  # noqa: PLC0415 - optional module

    return int(FRAME_SIZE)


def socket_floor(settings: Settings, one_cpu: bool) -> list[float]:
    """Round trips per second of the same bytes over the same socketpair, no pool at all.

    The floor for remote reuse: two processes, one wake-up each way, placed alike.
    """
    with placed(one_cpu):
        return _socket_floor(settings)


def _socket_floor(settings: Settings) -> list[float]:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    peer = get_context("fork").Process(target=_echo, args=(theirs, mine), daemon=True)
    peer.start()
    theirs.close()
    request = bytes(pool_frame_size()) + PAYLOAD

    def cycle(_: int) -> bool:
        mine.sendall(request)
        return mine.recv(len(PAYLOAD), socket.MSG_WAITALL) == PAYLOAD

    try:
        samples = calibrated_us(cycle, settings.seconds, settings.repeats)
    finally:
        mine.close()
        peer.join(10)
    return [1e6 / sample for sample in samples]


def _completer(pools: _Pools, commands: Connection, write_fd: int, stamp: mmap.mmap) -> None:
    """A forked owner: per round, make its unit active, then complete it on "fire"; or,
    asked for the floor, write its stamp to the pipe. Each fires ``_wake.PAUSE_S`` late.

    After firing, both go straight back to ``commands.recv()``: the completion's stamp is
    written to shared memory before it, as the floor's travels with its byte. (Sent
    back after the completion, it cost the waiter the reply's pickling and write,
    about 30 µs, whenever the two processes shared a CPU: the waiter ran only once the
    completer blocked, in 1,197 of 1,200 wakes on a loaded 2-core machine.)
    """
    fleet, pool = pools.join()
    rid, execution = pool.register_active(pools.key, 1)
    while (what := commands.recv()) is not None:
        if what == "pipe":
            time.sleep(_wake.PAUSE_S)  # the parent sleeps in select by now
            os.write(write_fd, _STAMP.pack(time.monotonic_ns()))
            continue
        if execution.done:
            execution = pool.accept(pool.reserve(rid))
        commands.send(0)  # active: the parent may read the version now
        commands.recv()
        time.sleep(_wake.PAUSE_S)  # the parent sleeps in wait_capacity by now
        _STAMP.pack_into(stamp, 0, time.monotonic_ns())
        execution.complete()
    pool.close()
    fleet.close()
    os._exit(0)


def wake_us(pools: _Pools, rounds: int) -> tuple[list[float], list[float]]:
    """Completion in one process -> return of wait_capacity in another, and the pipe floor
    in the same rounds (interleaved), in microseconds."""
    read_fd, write_fd = os.pipe()
    stamp = mmap.mmap(-1, mmap.PAGESIZE)
    mine, theirs = get_context("fork").Pipe()
    owner = get_context("fork").Process(
        target=_completer, args=(pools, theirs, write_fd, stamp), daemon=True
    )
    owner.start()
    fleet, pool = pools.join()
    samples: tuple[list[float], list[float]] = ([], [])
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(read_fd, selectors.EVENT_READ)
            for _ in range(rounds):
                mine.send("active")
                mine.recv()
                since = pool.version(pools.key)
                mine.send("fire")
                if pool.wait_capacity(pools.key, since, timeout=5.0) is None:
                    raise Skip("wait_capacity did not wake within 5 s")
                woke = time.monotonic_ns()
                samples[0].append((woke - _STAMP.unpack_from(stamp, 0)[0]) / 1000)
                mine.send("pipe")
                if not selector.select(5.0):
                    raise Skip("no pipe wake within 5 s")
                woke = time.monotonic_ns()
                samples[1].append((woke - _STAMP.unpack(os.read(read_fd, _STAMP.size))[0]) / 1000)
    finally:
        mine.send(None)
        owner.join(10)
        pool.close()
        fleet.close()
        stamp.close()
        os.close(read_fd)
        os.close(write_fd)
    return samples


def pool_results(ws: Workspace, settings: Settings) -> list[Result]:
    """Every pool figure, or one skipped row when orbitive.pool is not there.

    Each row is compared with the floor and alternatives of the closest lock
    figure: local reuse with one-process acquire + release, remote reuse with
    two processes on one key, 8-process acquire with 8 processes on one key.
    """
    try:
        pools = _Pools(ws)
    except Skip as exc:
        return [Result(SECTION, "all", "orbitive pool", "orbitive", "us", skipped=str(exc))]
    local = _row(
        SECTION,
        "local reuse (reserve + accept + complete)",
        "us",
        ("acquire + release", "1 process, 1 key"),
    )
    crowd = _row(SECTION, "acquire, 8 processes", "ops/s", ("contention", "8 processes, 1 key"))
    group = "completion -> woken wait_capacity"
    wake = Result(_wake.SECTION, group, "orbitive Pool", "orbitive", "us")
    wake_floor = Result(
        _wake.SECTION, group, "os.pipe write -> select (same rounds)", "floor", "us"
    )
    remote = {one_cpu: _remote_rows(suffix) for suffix, one_cpu in PLACEMENTS.items()}
    try:
        _fill(local, lambda: _local(pools, settings))
        for one_cpu, (reuse, floor) in remote.items():
            _fill(reuse, functools.partial(remote_reuse, pools, settings, one_cpu))
            _fill(floor, functools.partial(socket_floor, settings, one_cpu))
        _fill(crowd, lambda: _crowd(pools, settings, crowd))
        _wake_rows(pools, settings, wake, wake_floor)
    finally:
        pools.close()
    return [local, *(row for pair in remote.values() for row in pair), crowd, wake, wake_floor]


def _remote_rows(suffix: str) -> tuple[Result, Result]:
    """The remote-reuse row of one placement, and its socketpair floor."""
    group = f"remote reuse, Unix socket, 128 B{suffix}"
    reuse = _row(SECTION, group, "ops/s", ("contention", "2 processes, 1 key"))
    floor = _row(SECTION, group, "ops/s", ("contention", "2 processes, 1 key"))
    floor.name = "socketpair ping-pong, no pool (floor)"
    return reuse, floor


def _row(section: str, group: str, unit: Unit, compare: tuple[str, str]) -> Result:
    result = Result(section, group, "orbitive Pool", "orbitive", unit)
    result.compare = compare
    return result


def _fill(result: Result, measure: Callable[[], list[float]]) -> None:
    try:
        result.samples = measure()
    except Skip as exc:
        result.skipped = str(exc)


def _local(pools: _Pools, settings: Settings) -> list[float]:
    session = pools.reuse_cycle()
    try:
        return calibrated_us(session.cycle, settings.seconds, settings.repeats)
    finally:
        session.close()


def _crowd(pools: _Pools, settings: Settings, result: Result) -> list[float]:
    prepared = pools.local_reuse()
    rounds = [run_round(prepared, 8, 1, settings.window) for _ in range(settings.rounds)]
    return record(result, rounds, 8, 1).samples


def _wake_rows(pools: _Pools, settings: Settings, wake: Result, floor: Result) -> None:
    try:
        runs = [wake_us(pools, settings.wakes) for _ in range(settings.wake_repeats)]
    except Skip as exc:
        wake.skipped = floor.skipped = str(exc)
        return
    latency(wake, [pool for pool, _ in runs])
    latency(floor, [pipe for _, pipe in runs])
