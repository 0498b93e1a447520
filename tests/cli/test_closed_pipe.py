"""Every ``orbit`` command whose reader went away ends quietly (issue 24, item 3).

Each command runs as a real process (``python -m orbitive``) with its output going
into a pipe whose reader has already closed it, the earliest a reader can close:
its first write fails. It must exit with 141 (128 + SIGPIPE, what a shell reports
for a writer a closed pipe ended), print no traceback and no "Exception ignored"
at the interpreter's exit. ``orbit demo`` also runs into a real ``head -1`` and
under a Ctrl-C, and leaves no fleet behind either way.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbitive import Fleet
from orbitive.lock import LockKey, LockOwner, LockTable
from orbitive.pool import Key, Pool
from orbitive.store import open_store

from .._fleets import fleet_files
from .._processes import sigint_default

#: 128 + SIGPIPE.
EXIT_PIPE = 141
LOCK = "reports/nightly"


def into_closed_pipe(argv: list[str], stream: str = "stdout") -> subprocess.CompletedProcess[str]:
    """``python -m orbitive ARGV`` writing ``stream`` (stdout or stderr) into a pipe nobody
    reads any more, the other stream captured; waits for it to exit."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "orbitive", *argv],
            stdout=write if stream == "stdout" else subprocess.PIPE,
            stderr=write if stream == "stderr" else subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)


def assert_quiet_end(done: subprocess.CompletedProcess[str], other: str) -> None:
    assert done.returncode == EXIT_PIPE, (done.returncode, other)
    assert "Traceback" not in other and "Exception ignored" not in other, other
    assert other == "", other


@pytest.fixture
def busy_fleet(fleet_name: str) -> Iterator[LockTable]:
    """A fleet with a lock table holding a lease and a pool table; a stopped fleet of
    one object beside it (``-stopped``) for ``orbit clear``; a held store lock."""
    with Fleet.join(f"{fleet_name}-stopped", 2) as stopped:
        LockTable(stopped).close()
    with (
        Fleet.join(fleet_name, 4) as fleet,
        Pool(fleet) as pool,
        open_store() as store,
        store.lock(LOCK, ttl=60.0),
    ):
        pool.register(Key(7), 1)
        table = LockTable(fleet)
        table.try_acquire(LockKey("jobs", "nightly"), LockOwner(b"w1"), 60.0)
        yield table
        table.close()
        table.unlink()
    for path in fleet_files(f"{fleet_name}-stopped"):
        path.unlink()


def commands(fleet: str) -> list[list[str]]:
    """Every sub-command, each with arguments that make it write to stdout (and each
    --json form)."""
    return [
        ["list"],
        ["list", fleet],
        ["list", fleet, "--json"],
        ["clear", f"{fleet}-stopped", "--kind", "229"],
        ["locks", fleet],
        ["locks", fleet, "--json"],
        ["locks"],
        ["locks", "--json"],
        ["inspect", LOCK],
        ["pool", fleet],
        ["pool", fleet, "--json"],
        ["force-release", fleet, "jobs", "nightly"],
        ["force-release", LOCK],
        ["run", "--lock", "job", "--", "/bin/echo", "into the closed pipe"],
        ["demo", "--workers", "1", "--seconds", "0.5"],
        ["--help"],
        ["locks", "--help"],
        ["--version"],
    ]


def test_every_command_ends_quietly_with_141_when_its_reader_is_gone(
    busy_fleet: LockTable,
) -> None:
    fleet = busy_fleet.fleet.name
    for argv in commands(fleet):
        done = into_closed_pipe(argv)
        assert_quiet_end(done, done.stderr)
    assert fleet_files(f"{fleet}-stopped")[0].name.endswith("-228-0")  # clear did its work
    assert busy_fleet.current(LockKey("jobs", "nightly")) is None  # and so did force-release


def test_watch_ends_at_its_first_line_once_its_reader_is_gone(busy_fleet: LockTable) -> None:
    # A transition every 0.1 s until watch exits: its first line comes however late it
    # starts watching (a single one 1.5 s in came before a loaded interpreter watched).
    stop = threading.Event()
    key, owner = LockKey("jobs", "watched"), LockOwner(b"w2")

    def churn() -> None:
        while not stop.wait(0.1):
            busy_fleet.release(busy_fleet.try_acquire(key, owner, 60.0).lease)

    churner = threading.Thread(target=churn)
    churner.start()
    try:
        done = into_closed_pipe(["watch", busy_fleet.fleet.name, "--seconds", "60"])
    finally:
        stop.set()
        churner.join()
    assert_quiet_end(done, done.stderr)


def test_an_error_into_a_closed_pipe_ends_quietly(fleet_name: str) -> None:
    done = into_closed_pipe(["locks", fleet_name], stream="stderr")
    assert_quiet_end(done, done.stdout)


def _demo_fleets(header: str) -> list[Path]:
    found = re.search(r"fleet '(?:pool-)?demo-(\d+)'", header)
    assert found is not None, header
    pid = found.group(1)
    return fleet_files(f"demo-{pid}") + fleet_files(f"pool-demo-{pid}")


def test_demo_into_head_ends_with_141_and_leaves_no_fleet() -> None:
    demo = f"{sys.executable} -m orbitive demo --workers 2 --seconds 1"
    script = f"{demo} | head -1; exit ${{PIPESTATUS[0]}}"
    done = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.stdout.startswith("orbit demo, keyed leases: 2 workers")
    assert_quiet_end(done, done.stderr)
    assert _demo_fleets(done.stdout) == []


#: A parent that ignores SIGINT, as a background job's shell does: its children inherit it.
IGNORING_SIGINT = ["bash", "-c", "trap '' INT; exec \"$@\"", "bash"]


@pytest.mark.parametrize(
    ("scenario", "parent"),
    [("lock", []), ("pool", []), ("lock", IGNORING_SIGINT)],
    ids=["lock", "pool", "lock-under-a-parent-ignoring-sigint"],
)
def test_demo_interrupted_by_ctrl_c_exits_130_quietly_and_leaves_no_fleet(
    scenario: str, parent: list[str]
) -> None:
    demo_argv = [sys.executable, "-m", "orbitive", "demo", "--scenario", scenario]
    demo = subprocess.Popen(
        [*parent, *sigint_default([*demo_argv, "--seconds", "30", "--workers", "4"])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        assert demo.stdout is not None
        header = demo.stdout.readline()  # printed once the run starts, before the children
        os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C does: the whole group
        out, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
    assert demo.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "verdict" not in out  # it stopped long before its 30 s
    assert _demo_fleets(header) == []
