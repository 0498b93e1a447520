"""``orbit run``: flock(1) with leases (issue 3 item 7), run as a real subprocess."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbitive.store import Store, open_store

ORBIT = [sys.executable, "-m", "orbitive.cli"]


def orbit_run(
    url: str | None, *command: str, ttl: str = "10", wait: str | None = None
) -> list[str]:
    argv = [*ORBIT, "run", "--lock", "job", "--ttl", ttl]
    if wait is not None:
        argv += ["--wait", wait]
    if url is not None:
        argv += ["--store", url]
    return [*argv, "--", *command]


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


@pytest.fixture
def run_store(sqlite_url: str) -> Iterator[Store]:
    with open_store(sqlite_url) as store:
        yield store


def test_exits_with_the_commands_status_and_releases(sqlite_url: str, run_store: Store) -> None:
    done = subprocess.run(orbit_run(sqlite_url, *python("raise SystemExit(7)")), check=False)
    assert done.returncode == 7
    assert run_store.inspect("job") is None


def test_exports_the_fencing_token_while_holding(sqlite_url: str, run_store: Store) -> None:
    code = """
        import os, sys
        from orbitive.store import open_store
        info = open_store(sys.argv[1]).inspect("job")
        print(os.environ["ORBIT_FENCING_TOKEN"], info.fencing_token, info.owner)
    """
    argv = orbit_run(sqlite_url, *python(code), sqlite_url)
    done = subprocess.run(argv, check=True, capture_output=True, text=True)
    exported, held, owner = done.stdout.split()
    assert exported == held and int(exported) > 0
    assert owner.startswith("orbit-run:")
    assert run_store.inspect("job") is None


def test_busy_without_wait_exits_75_naming_the_holder(sqlite_url: str, run_store: Store) -> None:
    assert run_store.try_lock("job", "nightly-holder", 60.0) is not None
    done = subprocess.run(
        orbit_run(sqlite_url, "true"), check=False, capture_output=True, text=True
    )
    assert done.returncode == 75
    assert "nightly-holder" in done.stderr


def test_wait_gets_the_lock_once_released(sqlite_url: str, run_store: Store) -> None:
    holder = run_store.try_lock("job", "holder", 60.0)
    assert holder is not None
    proc = subprocess.Popen(orbit_run(sqlite_url, "true", wait="30"))
    time.sleep(0.3)
    assert proc.poll() is None  # still waiting
    assert holder.release()
    assert proc.wait(30) == 0


def test_wait_running_out_exits_75(sqlite_url: str, run_store: Store) -> None:
    assert run_store.try_lock("job", "holder", 60.0) is not None
    done = subprocess.run(orbit_run(sqlite_url, "true", wait="0.3"), check=False)
    assert done.returncode == 75


def test_renews_while_the_command_runs(sqlite_url: str, run_store: Store, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    # SQLite's leases run on the wall clock (time.time()): a forward step of it longer
    # than what is left of the ttl takes the lease away. 1.5 s leaves a second of room.
    code = f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(2.5)"
    proc = subprocess.Popen(orbit_run(sqlite_url, *python(code), ttl="1.5"))
    deadline = time.monotonic() + 30
    while not ready.exists():  # the command runs: orbit run holds the lock
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(1.8)  # past the first ttl: only renewal keeps it
    assert run_store.try_lock("job", "intruder", 60.0) is None
    assert proc.wait(30) == 0
    assert run_store.inspect("job") is None


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 3), (signal.SIGINT, 4)])
def test_signals_reach_the_command_and_the_lock_is_released(
    sqlite_url: str, run_store: Store, tmp_path: Path, signum: int, status: int
) -> None:
    ready, seen = tmp_path / "ready", tmp_path / "seen"
    code = f"""
        import pathlib, signal, sys, time
        def handler(signum, frame):
            pathlib.Path({str(seen)!r}).write_text(str(signum))
            sys.exit({3 if signum == signal.SIGTERM else 4})
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        pathlib.Path({str(ready)!r}).touch()
        time.sleep(60)
    """
    proc = subprocess.Popen(orbit_run(sqlite_url, *python(code)))
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    assert run_store.inspect("job") is not None
    proc.send_signal(signum)
    assert proc.wait(30) == status
    assert seen.read_text() == str(int(signum))
    assert run_store.inspect("job") is None


def test_command_killed_by_a_signal_gives_128_plus_n(sqlite_url: str, run_store: Store) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    done = subprocess.run(orbit_run(sqlite_url, *python(code)), check=False)
    assert done.returncode == 128 + signal.SIGKILL
    assert run_store.inspect("job") is None


def test_missing_command_exits_127_and_releases(sqlite_url: str, run_store: Store) -> None:
    done = subprocess.run(orbit_run(sqlite_url, "/nonexistent/orbit-cmd"), check=False)
    assert done.returncode == 127
    assert run_store.inspect("job") is None


def test_no_command_is_a_usage_error(sqlite_url: str) -> None:
    argv = [*ORBIT, "run", "--lock", "job", "--ttl", "5", "--store", sqlite_url]
    assert subprocess.run(argv, check=False, capture_output=True).returncode == 2


def test_bad_ttl_is_a_usage_error_naming_the_command(sqlite_url: str) -> None:
    done = subprocess.run(
        orbit_run(sqlite_url, "true", ttl="0"), check=False, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.startswith("orbit run: ") and "duration" in done.stderr


def test_negative_wait_is_a_usage_error(sqlite_url: str) -> None:
    argv = orbit_run(sqlite_url, "true", wait="-1")
    done = subprocess.run(argv, check=False, capture_output=True, text=True)
    assert done.returncode == 2
    assert "--wait must be a finite number >= 0" in done.stderr


def test_default_store_is_the_sqlite_file_in_the_state_dir(tmp_path: Path) -> None:
    env = dict(os.environ, XDG_STATE_HOME=str(tmp_path / "state"))
    done = subprocess.run(orbit_run(None, "true"), env=env, check=False)
    assert done.returncode == 0
    db = tmp_path / "state" / "orbitive" / "locks.db"
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
