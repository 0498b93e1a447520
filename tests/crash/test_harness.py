"""The harness the crash tests stand on: a fork waits for exiting threads, and a child
that does not answer is diagnosed.

``Thread.join`` returns before the thread's native teardown ends; a fork at that
moment copies whatever lock the teardown holds (under ``scripts/sanitize``, one of
AddressSanitizer's allocator locks) into a child that then never starts. A fork
hook here records, at each fork, the threads of the test process that are not
live Python threads.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import threading
import time

import pytest

from .._processes import DIAGNOSE_AFTER, SETTLE_S, Channel, Processes

JOINS = 200

#: What the fork hook saw: per fork, the threads that were not live Python threads.
_seen_at_fork: list[set[int]] = []
_watching = threading.Event()


def _record_strays() -> None:
    if _watching.is_set():
        live = {thread.native_id for thread in threading.enumerate()}
        _seen_at_fork.append({int(tid) for tid in os.listdir("/proc/self/task")} - live)


os.register_at_fork(before=_record_strays)


def report_start(channel: Channel) -> None:
    channel.send(time.monotonic())


def test_a_fork_right_after_a_join_waits_for_the_thread_to_be_gone() -> None:
    _seen_at_fork.clear()
    _watching.set()
    try:
        with Processes("fork") as processes:
            for _ in range(JOINS):
                thread = threading.Thread(target=sum, args=(range(100),))
                thread.start()
                thread.join()
                child = processes.start(report_start)
                child.recv()
                assert child.wait() == 0
    finally:
        _watching.clear()
    assert len(_seen_at_fork) == JOINS
    assert [strays for strays in _seen_at_fork if strays] == []


def _foreign_thread(seconds: float) -> None:
    """Start a native thread Python does not know of, sleeping ``seconds`` then exiting."""
    libc = ctypes.CDLL(None, use_errno=True)
    tid = ctypes.c_ulong()
    usleep = ctypes.cast(libc.usleep, ctypes.c_void_p)
    code = libc.pthread_create(ctypes.byref(tid), None, usleep, ctypes.c_void_p(int(seconds * 1e6)))
    assert code == 0, os.strerror(code)
    assert libc.pthread_detach(tid) == 0


def _tasks() -> int:
    return len(os.listdir("/proc/self/task"))


def test_a_fork_waits_out_a_short_lived_foreign_thread_and_not_a_long_lived_one() -> None:
    with Processes("fork") as processes:
        tasks = _tasks()
        started = time.monotonic()
        _foreign_thread(0.3)
        child = processes.start(report_start)
        assert child.recv() >= started + 0.3  # forked once it had exited
        assert _tasks() == tasks
        _foreign_thread(SETTLE_S + 1.0)
        started = time.monotonic()
        processes.start(report_start).recv()
        waited = time.monotonic() - started
        assert SETTLE_S <= waited < SETTLE_S + 1.0  # it outlived the wait: long-lived
        started = time.monotonic()
        processes.start(report_start).recv()
        assert time.monotonic() - started < 0.5  # known long-lived: no second wait
        deadline = time.monotonic() + 5.0
        while _tasks() > tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _tasks() == tasks


def _sleep_in_a_helper_thread() -> None:
    threading.Event().wait()


def never_answer(channel: Channel) -> None:
    del channel
    threading.Thread(target=_sleep_in_a_helper_thread, daemon=True).start()
    time.sleep(3600.0)


def test_a_child_that_does_not_answer_is_diagnosed_not_only_timed_out() -> None:
    with Processes("fork") as processes:
        child = processes.start(never_answer)
        with pytest.raises(TimeoutError) as caught:
            child.recv(DIAGNOSE_AFTER)
        assert child.kill() < 0
    told = str(caught.value)
    assert f"child {child.pid}: no message within {DIAGNOSE_AFTER} s" in told
    assert told.count("  thread ") == 2  # its main thread and the helper, from /proc
    assert "in never_answer" in told and "in _sleep_in_a_helper_thread" in told  # Python
    if shutil.which("gdb"):
        assert "Thread 2" in told and "#0 " in told  # gdb's native stacks


def test_a_short_wait_that_runs_out_is_not_diagnosed() -> None:
    with Processes("fork") as processes:
        child = processes.start(never_answer)
        with pytest.raises(TimeoutError) as caught:
            child.recv(0.2)
    assert str(caught.value) == f"child {child.pid}: no message within 0.2 s"
