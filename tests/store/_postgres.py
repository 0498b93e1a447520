"""A real, throw-away PostgreSQL server for tests and benchmarks.

``TempPostgres.start()`` finds ``initdb`` (``/usr/lib/postgresql/*/bin`` or the
PATH), initialises a cluster in a fresh temporary directory, starts ``postgres``
on a free port of 127.0.0.1 and waits until it accepts connections. As root the
server runs as the ``postgres`` (or ``nobody``) user, since initdb refuses root.
``stop()`` shuts it down (fast mode, then SIGKILL) and removes the directory.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Final

import psycopg

_START_TIMEOUT_S: Final = 60.0
_SETTINGS: Final = (
    "fsync=off",
    "synchronous_commit=off",
    "full_page_writes=off",
    "max_connections=100",
    "shared_buffers=32MB",
)


class PostgresUnavailable(Exception):
    """No server binary, or the server would not start; the message says why."""


def find_bin_dir() -> Path | None:
    """The directory of the newest ``initdb``/``postgres`` pair, or None."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    found = shutil.which("initdb")
    if found:
        candidates.append(found)
    for initdb in candidates:
        directory = Path(initdb).parent
        if (directory / "postgres").exists():
            return directory
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _run_as() -> tuple[list[str], pwd.struct_passwd | None]:
    """A command prefix that drops root, and the user it drops to (None: not root)."""
    if os.geteuid() != 0:
        return [], None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            user = pwd.getpwnam(name)
            prefix = ["setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}"]
            return [*prefix, "--clear-groups", "--"], user
    raise PostgresUnavailable("running as root and no 'postgres' or 'nobody' user exists")


class TempPostgres:
    """One running server; ``url`` connects as superuser ``postgres`` (trust auth)."""

    def __init__(self, root: Path, process: subprocess.Popen[bytes], port: int) -> None:
        self.root = root
        self.process = process
        self.port = port
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    @classmethod
    def start(cls) -> TempPostgres:
        """Start a server. Raises PostgresUnavailable with the reason."""
        bin_dir = find_bin_dir()
        if bin_dir is None:
            raise PostgresUnavailable("no initdb/postgres binary found (install postgresql)")
        prefix, user = _run_as()
        root = Path(tempfile.mkdtemp(prefix="orbit-pg-"))
        try:
            if user is not None:
                os.chown(root, user.pw_uid, user.pw_gid)
            _initdb(prefix, bin_dir, root)
            return cls._launch(prefix, bin_dir, root)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise

    @classmethod
    def _launch(cls, prefix: list[str], bin_dir: Path, root: Path) -> TempPostgres:
        port = _free_port()
        settings = [arg for setting in _SETTINGS for arg in ("-c", setting)]
        command = [*prefix, str(bin_dir / "postgres"), "-D", str(root / "data")]
        command += ["-p", str(port), "-h", "127.0.0.1", "-k", str(root), *settings]
        log = (root / "server.log").open("wb")
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=root,
        )
        log.close()
        server = cls(root, process, port)
        try:
            server._wait_ready()
        except BaseException:
            server.stop()
            raise
        return server

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            if self.process.poll() is not None:
                raise PostgresUnavailable(f"postgres exited: {self.log_tail()}")
            try:
                with psycopg.connect(self.url, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    tail = self.log_tail()
                    raise PostgresUnavailable(f"postgres did not start: {tail}") from None
                time.sleep(0.05)

    def log_tail(self) -> str:
        """The last lines of the server log."""
        try:
            return (self.root / "server.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Fast shutdown (SIGINT), SIGKILL after 30 s, then remove the directory."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def _initdb(prefix: list[str], bin_dir: Path, root: Path) -> None:
    command = [*prefix, str(bin_dir / "initdb"), "-D", str(root / "data")]
    command += ["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"]
    env = dict(os.environ, LC_ALL="C", LANG="C")
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, check=False)
    if done.returncode != 0:
        output = (done.stdout + done.stderr).decode(errors="replace")[-2000:]
        raise PostgresUnavailable(f"initdb failed ({done.returncode}): {output}")
