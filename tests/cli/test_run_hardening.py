"""``orbit run``: CMD dies with it (even after SIGKILL), ``--quiet``, ``--on-lost``, defaults.

Each test runs the real command in a fresh interpreter, against a SQLite store of
its own; a lease is lost by force-releasing it from the test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbitive.store import Store, open_store

ORBIT = [sys.executable, "-m", "orbitive"]
#: Generous bound for anything to happen on a loaded 2-core machine.
BOUND_S = 30.0


@pytest.fixture
def store(sqlite_url: str) -> Iterator[Store]:
    with open_store(sqlite_url) as opened:
        yield opened


def orbit_run(url: str, *options: str, code: str) -> list[str]:
    """``orbit run --lock job --store URL OPTIONS -- python -c CODE``."""
    return [*ORBIT, "run", "--lock", "job", "--store", url, *options, "--", *python(code)]


def python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def wait_for(path: Path, proc: subprocess.Popen[str]) -> str:
    """The contents of ``path`` once the command wrote it (``proc`` must still run)."""
    deadline = time.monotonic() + BOUND_S
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, "the command never started"
        time.sleep(0.02)
    return path.read_text()


def is_running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's new parent may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def pid_writer(path: Path, first: str = "pass") -> str:
    """A command that runs ``first``, writes its pid to ``path`` and sleeps 60 s."""
    return f"""
        import os, pathlib, signal, sys, time
        {first}
        pathlib.Path({str(path)!r}).write_text(str(os.getpid()))
        time.sleep(60)
    """


def test_sigkill_of_orbit_run_kills_the_command_and_force_release_frees_the_lock(
    sqlite_url: str, store: Store, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pid"
    argv = orbit_run(sqlite_url, "--ttl", "1000", code=pid_writer(pid_file))
    proc = subprocess.Popen(argv, text=True)
    child = int(wait_for(pid_file, proc))
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(BOUND_S) == -signal.SIGKILL
    deadline = time.monotonic() + BOUND_S
    while is_running(child):
        assert time.monotonic() < deadline, "the command outlived orbit run"
        time.sleep(0.02)
    holder = store.inspect("job")
    assert holder is not None and holder.owner.startswith("orbit-run:")  # held for the TTL
    done = subprocess.run(
        [*ORBIT, "force-release", "--store", sqlite_url, "job"],
        capture_output=True,
        text=True,
        check=False,
        timeout=BOUND_S,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "released")
    assert store.try_lock("job", "next-run", 10.0) is not None


def test_quiet_skip_prints_nothing_and_still_exits_75(sqlite_url: str, store: Store) -> None:
    assert store.try_lock("job", "nightly-holder", 60.0) is not None
    argv = orbit_run(sqlite_url, "--quiet", code="print('ran')")
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=BOUND_S)
    assert (done.returncode, done.stdout, done.stderr) == (75, "", "")


@pytest.mark.parametrize(
    ("options", "ignores_term"),
    [((), False), (("--on-lost", "term"), False), (("--on-lost", "kill"), True)],
    ids=["default-term", "term", "kill-even-if-term-is-ignored"],
)
def test_lost_lock_signals_the_command_and_exits_76(
    sqlite_url: str, store: Store, tmp_path: Path, options: tuple[str, ...], ignores_term: bool
) -> None:
    pid_file = tmp_path / "pid"
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN)" if ignores_term else "pass"
    code = pid_writer(pid_file, first=ignore)
    proc = subprocess.Popen(
        orbit_run(sqlite_url, "--ttl", "0.9", *options, code=code),
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(pid_file, proc)
    started = time.monotonic()
    assert store.force_release("job")
    _, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 76
    assert "orbit run: lost lock 'job'" in err
    assert "is lost: the store no longer had it while its TTL had time left" in err  # the cause
    assert ("SIGKILL" if ignores_term else "SIGTERM") in err
    assert time.monotonic() - started < BOUND_S  # far sooner than the command's 60 s


def test_on_lost_ignore_lets_the_command_finish_with_its_status(
    sqlite_url: str, store: Store, tmp_path: Path
) -> None:
    released = tmp_path / "released"
    code = f"""
        import pathlib, sys, time
        from orbitive.store import open_store
        pathlib.Path({str(released)!r}).write_text("ready")
        deadline = time.monotonic() + {BOUND_S}
        while open_store(sys.argv[1]).inspect("job") is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(2.0)  # ten renewal intervals: the loss has been noticed
        sys.exit(5)
    """
    argv = [*orbit_run(sqlite_url, "--ttl", "0.6", "--on-lost", "ignore", code=code), sqlite_url]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    wait_for(released, proc)
    assert store.force_release("job")
    _, err = proc.communicate(timeout=BOUND_S)
    assert proc.returncode == 5
    assert "lost lock 'job'" in err and "the command keeps running" in err


def test_ttl_is_optional_and_help_explains_renewal_ttl_and_exit_codes(sqlite_url: str) -> None:
    argv = [*ORBIT, "run", "--lock", "job", "--store", sqlite_url, "--", "true"]
    assert subprocess.run(argv, check=False, timeout=BOUND_S).returncode == 0
    done = subprocess.run(
        [*ORBIT, "run", "--help"], capture_output=True, text=True, check=True, timeout=BOUND_S
    )
    text = " ".join(done.stdout.split())
    assert "--ttl S lease length in seconds, renewed every S/3 (default 30)" in text
    assert "renewed every TTL/3 (every 10 s by default)" in text
    assert "PR_SET_PDEATHSIG" in text and "--quiet" in text
    for code in ("75 the lock is busy", "76 the lock was lost"):
        assert code in text
    assert os.environ.get("ORBIT_FENCING_TOKEN") is None
