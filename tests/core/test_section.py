"""The section block: robust mutex twins (C and ctypes), recovery from dead holders,
the flock mechanism, refusals of blocks a process cannot use, and fork."""

from __future__ import annotations

import mmap
import os
import random
import signal
import threading
import time
from collections.abc import Callable

import pytest

from orbitive import Fleet
from orbitive._core import _robust, _section
from orbitive._core._errors import FleetError, LayoutMismatch
from orbitive._core._region import Region
from orbitive._core._section import BLOCK, FLOCK, ROBUST_MUTEX, recoveries
from orbitive.lock import Acquired, LockOwner, LockTable

from .._children import KEY, stop_in_critical_section
from .._processes import Channel, Processes
from .conftest import TWINS

KIND = 151
SIZE = mmap.PAGESIZE


def no_check(buf: mmap.mmap) -> None:
    del buf


def open_region(fleet_name: str) -> Region:
    return Region.open_shared(fleet_name, KIND, SIZE, lambda buf: None, no_check)


def use_twin(twin: str) -> None:
    """Make this process lock sections with the C module or with ctypes."""
    if twin == "ctypes":
        vars(_section)["_robust_c"] = None


def hold_and_die(channel: Channel, fleet_name: str, twin: str) -> None:
    """Lock the region's section, say so, then die holding it."""
    use_twin(twin)
    region = open_region(fleet_name)
    region.acquire()
    channel.send("held")
    time.sleep(60)


def test_every_mechanism_is_handed_on_when_its_holder_is_killed(
    processes: Processes, fleet_name: str, mechanism: str
) -> None:
    region = open_region(fleet_name)
    assert region.section is not None
    assert region.section.mechanism == {"mutex": ROBUST_MUTEX, "flock": FLOCK}[mechanism]
    holder = processes.start(hold_and_die, fleet_name, "c")
    assert holder.recv() == "held"
    blocked = threading.Event()

    def enter() -> None:
        region.acquire()
        blocked.set()
        region.release()

    waiter = threading.Thread(target=enter)
    waiter.start()
    assert not blocked.wait(0.3), "the section is held by the other process"
    assert holder.kill() == -signal.SIGKILL
    assert blocked.wait(10.0)
    waiter.join()
    expected = 1 if mechanism == "mutex" else 0  # EOWNERDEAD was seen and repaired
    assert recoveries(region.block) == expected
    region.close()
    region.unlink()


@pytest.mark.parametrize(("holder_twin", "waiter_twin"), [("c", "ctypes"), ("ctypes", "c")])
def test_the_twins_exclude_each_other_and_repair_each_others_dead_holders(
    processes: Processes, fleet_name: str, holder_twin: str, waiter_twin: str
) -> None:
    region = open_region(fleet_name)
    holder = processes.start(hold_and_die, fleet_name, holder_twin)
    assert holder.recv() == "held"
    result = processes.start(lock_once, fleet_name, waiter_twin)
    with pytest.raises(TimeoutError):
        result.recv(timeout=0.3)
    assert holder.kill() == -signal.SIGKILL
    assert result.recv() == ("locked", 1)
    region.acquire()  # and it is a normal, consistent mutex again
    region.release()
    region.close()
    region.unlink()


def lock_once(channel: Channel, fleet_name: str, twin: str) -> None:
    use_twin(twin)
    region = open_region(fleet_name)
    region.acquire()
    region.release()
    channel.send(("locked", recoveries(region.block)))


def acquire_and_stop_in_repair(channel: Channel, fleet_name: str) -> None:
    """Lock a section whose holder died, and stop between EOWNERDEAD and the repair."""
    use_twin("ctypes")

    def stop() -> None:
        channel.send("repairing")
        os.kill(os.getpid(), signal.SIGSTOP)

    _robust.recovery_hook = stop
    table = LockTable(Fleet.join(fleet_name, 4))
    table._bind(None)  # the Python operation, through the ctypes twin and its hook
    table.try_acquire(KEY, LockOwner(b"repairer"), 60.0)


def test_a_second_holder_killed_during_the_repair_blocks_nobody(
    processes: Processes, fleet_name: str
) -> None:
    table = LockTable(Fleet.join(fleet_name, 4))
    victim = processes.start(stop_in_critical_section, fleet_name, 4, "acquire")
    assert victim.recv() == "stopped"  # inside its step, slot tombstoned
    assert victim.kill() == -signal.SIGKILL
    repairer = processes.start(acquire_and_stop_in_repair, fleet_name)
    assert repairer.recv() == "repairing"
    assert repairer.kill() == -signal.SIGKILL
    assert table.leases() == []  # the mutex was repaired here, and the table is consistent
    assert isinstance(table.try_acquire(KEY, LockOwner(b"survivor"), 30.0), Acquired)
    # The victim held the whole section: each of its stripes was repaired once.
    assert recoveries(table._state.block) == table.layout.stripes
    table.unlink()


def test_an_unknown_mechanism_or_a_foreign_mutex_is_layout_mismatch(fleet_name: str) -> None:
    region = open_region(fleet_name)
    original = region.block[: BLOCK.size]
    magic, version, _, glibc, size, stripes = BLOCK.unpack(original)
    for damaged in (
        BLOCK.pack(magic, version, 9, glibc, size, stripes),
        BLOCK.pack(magic, version, ROBUST_MUTEX, glibc, size + 8, stripes),
        BLOCK.pack(magic, version, ROBUST_MUTEX, 0, size, stripes),
        BLOCK.pack(magic ^ 1, version, ROBUST_MUTEX, glibc, size, stripes),
        BLOCK.pack(magic, version + 1, ROBUST_MUTEX, glibc, size, stripes),
        BLOCK.pack(magic, version, ROBUST_MUTEX, glibc, size, stripes + 1),
        BLOCK.pack(magic, version, ROBUST_MUTEX, glibc, size, 0),
    ):
        region.block[: BLOCK.size] = damaged
        with pytest.raises(LayoutMismatch):
            open_region(fleet_name)
    region.block[: BLOCK.size] = original
    open_region(fleet_name).close()
    region.close()
    region.unlink()


def test_a_process_that_cannot_lock_the_recorded_mutex_refuses(
    fleet_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    region = open_region(fleet_name)
    monkeypatch.setattr(_section, "_mutex_type", lambda: None)
    with pytest.raises(LayoutMismatch, match="cannot lock"):
        open_region(fleet_name)
    monkeypatch.setenv("ORBIT_SECTION", "mutex")
    with pytest.raises(LayoutMismatch, match="ORBIT_SECTION=mutex"):
        open_region(fleet_name + "x")
    region.close()
    region.unlink()


def test_a_bad_orbit_section_value_is_refused(
    fleet_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORBIT_SECTION", "spinlock")
    with pytest.raises(LayoutMismatch, match="ORBIT_SECTION"):
        open_region(fleet_name)


def test_peers_follow_the_recorded_mechanism(
    fleet_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORBIT_SECTION", "flock")
    creator = open_region(fleet_name)
    monkeypatch.delenv("ORBIT_SECTION")
    peer = open_region(fleet_name)
    assert peer.section is not None and peer.section.mechanism == FLOCK
    creator.close()
    peer.close()
    peer.unlink()


def fork_while_a_thread_is_inside(channel: Channel, fleet_name: str) -> None:
    """Fork while another thread holds the table's section; the child's first call completes."""
    table = LockTable(Fleet.join(fleet_name, 4))
    inside, leave = threading.Event(), threading.Event()

    def hold() -> None:
        table._state.acquire()
        inside.set()
        leave.wait(10.0)
        table._state.release()

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(10.0)
    pid = os.fork()
    if pid == 0:
        result = table.try_acquire(KEY, LockOwner(b"child"), 30.0)
        os._exit(0 if isinstance(result, Acquired) else 1)
    time.sleep(0.2)
    leave.set()
    holder.join()
    _, status = os.waitpid(pid, 0)
    channel.send(os.waitstatus_to_exitcode(status))


def test_a_fork_while_another_thread_is_inside_a_section_never_deadlocks(
    processes: Processes, fleet_name: str, mechanism: str
) -> None:
    del mechanism
    assert processes.start(fork_while_a_thread_is_inside, fleet_name).recv(timeout=30) == 0


@pytest.mark.parametrize("path", ["region", "c-operation"])
def test_a_thread_waiting_for_another_processs_section_does_not_hold_the_gil(
    processes: Processes, fleet_name: str, path: str
) -> None:
    table = LockTable(Fleet.join(fleet_name, 4))
    holder = processes.start(hold_table_section, fleet_name)
    assert holder.recv() == "held"
    entered = threading.Event()

    def wait() -> None:
        if path == "region":
            table._state.acquire()
            table._state.release()
        else:
            table.try_acquire(KEY, LockOwner(b"waiter"), 30.0)
        entered.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    spins, deadline = 0, time.monotonic() + 0.3
    while time.monotonic() < deadline:  # this thread runs Python while the other one waits
        spins += 1
    assert not entered.is_set()
    assert spins > 10_000, "the waiting thread held the GIL"
    holder.send("go")
    assert entered.wait(10.0)
    waiter.join()
    table.unlink()


def hold_table_section(channel: Channel, fleet_name: str) -> None:
    """Hold the lock table's section until told to let go."""
    table = LockTable(Fleet.join(fleet_name, 4))
    table._state.acquire()
    channel.send("held")
    channel.recv()
    table._state.release()


class Interrupted(Exception):
    """What the test's SIGALRM handler raises."""


def hold_for_a_while(channel: Channel, fleet_name: str) -> None:
    """Lock the region's section for 0.6 s, then let go."""
    region = open_region(fleet_name)
    region.acquire()
    channel.send("held")
    time.sleep(0.6)
    region.release()
    channel.send("released")
    channel.recv()


def interrupt(signum: int, frame: object) -> None:
    raise Interrupted


def test_a_signal_handler_raising_once_the_section_is_locked_leaves_it_unlocked(
    processes: Processes, fleet_name: str, mechanism: str, locking_twin: str
) -> None:
    """SIGALRM arrives while this process waits for the section; its handler runs (and
    raises) only once the lock is taken. The section must not stay held by this live
    thread: another process locks it at once."""
    region = open_region(fleet_name)
    holder = processes.start(hold_for_a_while, fleet_name)
    assert holder.recv() == "held"
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(Interrupted):
            region.acquire()
            region.release()  # the handler ran before the lock was taken (ctypes' slices)
            signal.pause()  # unreachable unless the alarm is still due: let it ring
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert holder.recv(timeout=5) == "released"
    assert processes.start(lock_once, fleet_name, "c").recv(timeout=5) == ("locked", 0)
    region.acquire()  # and this thread can enter again
    region.release()
    holder.send("done")
    region.close()
    region.unlink()


@pytest.mark.parametrize("twin", TWINS)
def test_release_mine_unlocks_only_the_stripes_this_thread_holds(twin: str) -> None:
    c_twin = getattr(vars(_section)["_robust_c"], "RobustMutex", None)  # None: not built
    make = _robust.RobustMutex if twin == "ctypes" else c_twin
    if make is None or not _robust.GLIBC:
        pytest.skip("no robust mutex twin here")
    block = mmap.mmap(-1, _robust.SECTION_BYTES)
    mutex = make(block, 3)
    mutex.create()
    assert mutex.release_mine() == 0  # nothing held
    mutex.acquire()
    results: list[int] = []
    other = threading.Thread(target=lambda: results.append(mutex.release_mine()))
    other.start()
    other.join()
    assert results == [0]  # another thread's hold is not its to undo
    assert mutex.release_mine() == 3
    mutex.acquire()  # unlocked: it locks again at once
    mutex.release()


@pytest.mark.parametrize("twin", TWINS)
def test_a_second_mapping_of_a_block_going_leaves_the_hold_through_the_first(twin: str) -> None:
    """One block mapped twice in a process (a closed store's, freed by the garbage
    collector later): the futex words name this thread through both, but the hold is
    the first mapping's, and the second one going must not end it."""
    c_twin = getattr(vars(_section)["_robust_c"], "RobustMutex", None)  # None: not built
    make = _robust.RobustMutex if twin == "ctypes" else c_twin
    if make is None or not _robust.GLIBC:
        pytest.skip("no robust mutex twin here")
    fd = os.memfd_create("block")
    try:
        os.ftruncate(fd, _robust.SECTION_BYTES)
        first, second = (mmap.mmap(fd, _robust.SECTION_BYTES) for _ in range(2))
    finally:
        os.close(fd)
    held = make(first, 3)
    held.create()
    other = make(second, 3)
    held.acquire()
    del other  # its block may be unmapped now: nothing of this thread is linked through it
    held.release()  # EPERM if the other mapping's going had unlocked the stripes
    assert held.release_mine() == 0
    held.acquire()  # and the stripes lock again at once
    held.release()


def test_the_twins_agree_where_glibc_links_a_held_mutex() -> None:
    c_module = vars(_section)["_robust_c"]
    if c_module is None or not _robust.GLIBC:
        pytest.skip("the C twin is not built, or no glibc")
    assert c_module.MUTEX_LIST_AT == _robust._LIST_AT


def test_a_c_mutex_never_initialised_refuses_every_call() -> None:
    c_twin = getattr(vars(_section)["_robust_c"], "RobustMutex", None)  # None: not built
    if c_twin is None:
        pytest.skip("the C twin is not built")
    fresh = c_twin.__new__(c_twin)
    for call in (fresh.create, fresh.acquire, fresh.release, fresh.release_mine):
        with pytest.raises(ValueError, match="not initialised"):  # never a touch of no block
            call()
    with pytest.raises(ValueError, match="smaller"):
        fresh.__init__(mmap.mmap(-1, 100))
    with pytest.raises(ValueError, match="not initialised"):
        fresh.acquire()


def enter_and_leave(region: Region) -> None:
    region.acquire()
    region.release()


def test_a_signal_handler_raising_at_any_point_of_acquire_leaves_nothing_held(
    processes: Processes, fleet_name: str, mechanism: str, locking_twin: str
) -> None:
    """A raising SIGALRM a few microseconds into each of many entries: whatever point of
    acquire the exception leaves from, this thread holds nothing afterwards (neither the
    process mutex nor the section: another process and another thread enter at once).

    The region is entered as every step enters it, ``with region:``, and the block waits
    for the signal, so each round ends in one exception, from inside ``acquire`` or from
    the block (whose exit lets go): none can surface in between (see ``Region``)."""
    region = open_region(fleet_name)
    rang: list[bool] = []

    def ring(signum: int, frame: object) -> None:
        rang.append(True)
        raise Interrupted

    rng, cut_short, inside_acquire = random.Random(7), 0, 0
    previous = signal.signal(signal.SIGALRM, ring)
    try:
        for _ in range(1500):
            rang.clear()
            try:
                signal.setitimer(signal.ITIMER_REAL, rng.uniform(1e-6, 60e-6))
                with region:
                    while not rang:  # one exception per round
                        time.sleep(0.001)
            except Interrupted as error:
                cut_short += 1
                inside_acquire += raised_in(error, Region.acquire)
                assert not region.holds()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert cut_short == 1500
    assert inside_acquire > 0
    assert processes.start(lock_once, fleet_name, "c").recv(timeout=5) == ("locked", 0)
    other = threading.Thread(target=enter_and_leave, args=(region,), daemon=True)
    other.start()
    other.join(5.0)
    assert not other.is_alive()
    region.close()
    region.unlink()


def raised_in(error: BaseException, function: Callable[..., object]) -> bool:
    """Whether ``error`` passed through a frame of ``function`` on its way up."""
    trace = error.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code is function.__code__:
            return True
        trace = trace.tb_next
    return False


def test_a_thread_inside_the_section_entering_again_is_refused(fleet_name: str) -> None:
    """A re-entry (a signal handler's step inside one of this thread's steps) raises
    instead of waiting for itself, and leaves the outer step's hold intact."""
    region = open_region(fleet_name)
    region.acquire()
    with pytest.raises(FleetError, match="entered again"):
        region.acquire()
    other = threading.Thread(target=enter_and_leave, args=(region,), daemon=True)
    other.start()
    other.join(0.3)
    assert other.is_alive()  # still held by the outer step
    region.release()
    other.join(5.0)
    assert not other.is_alive()
    region.close()
    region.unlink()
