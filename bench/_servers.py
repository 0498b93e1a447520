"""Throw-away servers on 127.0.0.1 for the network alternatives: redis-server and PostgreSQL.

Each ``start_*`` finds the binary, starts it on a free port in a fresh temporary
directory, waits until it answers and returns a :class:`Server`; it raises
:class:`Skip` with the reason when the binary is missing or will not start. As
root, PostgreSQL runs as the ``postgres`` (or ``nobody``) user: initdb refuses root.
Each server leads its own process group; ``stop`` signals the whole group.
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
from dataclasses import dataclass
from pathlib import Path

from ._measure import Skip

_START_TIMEOUT_S = 30.0
_PG_SETTINGS = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")


@dataclass
class Server:
    """A running server: ``port`` on 127.0.0.1, its process and its directory."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    root: Path

    def log_tail(self) -> str:
        """The end of the server log, for a skip reason."""
        with contextlib.suppress(OSError):
            return (self.root / "server.log").read_text(errors="replace")[-600:]
        return "(no log)"

    def stop(self) -> None:
        """SIGINT to its process group (a fast shutdown for both servers), SIGKILL after 10 s.

        Then the directory is removed.
        """
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _launch(name: str, command: list[str], root: Path, port: int) -> Server:
    with (root / "server.log").open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True
        )
    server = Server(name, port, process, root)
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not _answers(port):
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise Skip(f"{name} did not start: {server.log_tail()}")
        time.sleep(0.05)
    return server


def _answers(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def start_redis() -> Server:
    """redis-server without persistence on a free port."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise Skip("redis-server not found (apt-get install redis-server)")
    root = Path(tempfile.mkdtemp(prefix="orbit-bench-redis-"))
    port = free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    command += ["--appendonly", "no", "--dir", str(root)]
    return _launch("redis-server", command, root, port)


def _pg_bin_dir() -> Path:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if found := shutil.which("initdb"):
        candidates.append(found)
    for initdb in candidates:
        if (Path(initdb).parent / "postgres").exists():
            return Path(initdb).parent
    raise Skip("no initdb/postgres binary found (apt-get install postgresql)")


def _unprivileged(root: Path) -> list[str]:
    """A command prefix dropping root to an unprivileged owner of ``root`` ([] if not root)."""
    if os.geteuid() != 0:
        return []
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            user = pwd.getpwnam(name)
            os.chown(root, user.pw_uid, user.pw_gid)
            if shutil.which("setpriv"):  # execs in place: the server stays our direct child
                ids = [f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
                return ["setpriv", *ids, "--"]
            return ["runuser", "-u", name, "--"]
    raise Skip("running as root and no 'postgres' or 'nobody' user to run PostgreSQL as")


def start_postgres(*settings: str) -> Server:
    """A fresh PostgreSQL cluster (trust auth, no fsync) on a free port.

    ``settings`` are more ``name=value`` server settings (``-c``); the server logs
    to ``root / "server.log"``.
    """
    bin_dir = _pg_bin_dir()
    root = Path(tempfile.mkdtemp(prefix="orbit-bench-pg-"))
    try:
        prefix = _unprivileged(root)
        initdb = [*prefix, str(bin_dir / "initdb"), "-D", str(root / "data"), "-U", "postgres"]
        initdb += ["-A", "trust", "-E", "UTF8", "--no-sync"]
        env = dict(os.environ, LC_ALL="C", LANG="C")
        done = subprocess.run(initdb, cwd=root, env=env, capture_output=True, check=False)
        if done.returncode != 0:
            raise Skip(f"initdb failed: {(done.stdout + done.stderr).decode()[-600:]}")
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    port = free_port()
    command = [*prefix, str(bin_dir / "postgres"), "-D", str(root / "data"), "-p", str(port)]
    command += ["-h", "127.0.0.1", "-k", str(root)]
    command += [arg for setting in (*_PG_SETTINGS, *settings) for arg in ("-c", setting)]
    return _launch("postgres", command, root, port)


def postgres_url(server: Server) -> str:
    """The connection URL of a server from :func:`start_postgres`."""
    return f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
