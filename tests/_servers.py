"""Throw-away servers on 127.0.0.1, for the tests and the benchmarks: PostgreSQL, Redis, PgBouncer.

Each ``start`` finds the binary, starts the server on a free port in a fresh
temporary directory, waits until it answers, and raises :class:`ServerUnavailable`
with the reason when the binary is missing or the server will not start. Each
server leads its own session (process group), so :meth:`stop` ends every process
it started, and removes its directory. A tether beside each server does the same
once the process that started it is gone, however it ended (a SIGTERM or SIGKILL of
the suite runs no teardown). As root, PostgreSQL and PgBouncer run as
the ``postgres`` (or ``nobody``) user: both refuse to run as root.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import psycopg
import redis

_START_TIMEOUT_S: Final = 60.0
_STOP_TIMEOUT_S: Final = 30.0
#: What makes a throw-away cluster durable, as a budget's coordinator must be (the later
#: ``-c`` of a setting wins over :data:`POSTGRES_SETTINGS`' own).
DURABLE_POSTGRES: Final = ("fsync=on", "synchronous_commit=on")
#: PostgreSQL settings of every throw-away cluster: fast, not durable.
POSTGRES_SETTINGS: Final = (
    "fsync=off",
    "synchronous_commit=off",
    "full_page_writes=off",
    "max_connections=100",
    "shared_buffers=32MB",
)


#: The tether's program: it waits for a byte on its pipe; told (the server was stopped)
#: it exits, and at the pipe's end with nothing said (the process that started the
#: server is gone, and every child forked since) it ends the server's process group
#: (SIGINT, SIGTERM, then SIGKILL, each given a few seconds) and removes its directory.
_TETHER: Final = """
import os, shutil, signal, sys, time
if sys.stdin.buffer.read(1):
    sys.exit()
group, root = int(sys.argv[1]), sys.argv[2]
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
    try:
        os.killpg(group, sig)
        for _ in range(50):
            time.sleep(0.1)
            os.killpg(group, 0)
    except ProcessLookupError:
        break
shutil.rmtree(root, ignore_errors=True)
"""


class ServerUnavailable(Exception):
    """No server binary, or the server would not start; the message says why."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def unprivileged(root: Path) -> list[str]:
    """A command prefix that drops root to ``postgres`` (or ``nobody``), who then owns
    ``root`` and everything in it; ``[]`` when not root.

    Raises:
        ServerUnavailable: running as root and neither user exists.
    """
    if os.geteuid() != 0:
        return []
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            user = pwd.getpwnam(name)
            for path in (root, *root.iterdir()):
                os.chown(path, user.pw_uid, user.pw_gid)
            ids = [f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
            return ["setpriv", *ids, "--"]  # execs in place: the server stays our child
    raise ServerUnavailable("running as root and no 'postgres' or 'nobody' user exists")


class TempServer:
    """A server process in its own session, logging to ``root / "server.log"``."""

    name = "server"

    def __init__(self, root: Path, command: list[str], port: int) -> None:
        self.root = root
        self.command = command
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None
        #: The tether and the write end of its pipe, while the server runs.
        self._tether: tuple[subprocess.Popen[bytes], int] | None = None

    def _run(self, ready: Callable[[], bool]) -> None:
        """Start the command and wait until ``ready()`` (a failed start stops it).

        Raises:
            ServerUnavailable: it exited, or was not ready within the start timeout.
        """
        with (self.root / "server.log").open("ab") as log:
            self.process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
                start_new_session=True,
            )
        self._tie(self.process.pid)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise ServerUnavailable(f"{self.name} did not start: {tail}")
            time.sleep(0.05)

    def _tie(self, group: int) -> None:
        """Start the tether of the server's process group (see :data:`_TETHER`): its pipe
        stays open while this process (or a child forked since) lives."""
        read, write = os.pipe()
        try:
            tether = subprocess.Popen(
                [sys.executable, "-c", _TETHER, str(group), str(self.root)],
                stdin=read,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except BaseException:
            os.close(write)
            raise
        finally:
            os.close(read)
        self._tether = (tether, write)

    def _untie(self) -> None:
        """Tell the tether the server was stopped here: it exits, touching nothing."""
        tied, self._tether = self._tether, None
        if tied is not None:
            tether, write = tied
            with contextlib.suppress(OSError):
                os.write(write, b"stopped")
            os.close(write)
            try:
                tether.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                tether.kill()
                tether.wait()

    def log_tail(self) -> str:
        """The last lines of the server log."""
        try:
            return (self.root / "server.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def halt(self) -> None:
        """End the server's process group (SIGINT, a fast shutdown for PostgreSQL, then
        SIGTERM; SIGKILL after a bound); the directory stays."""
        self._untie()
        process = self.process
        if process is None or process.poll() is not None:
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)
            try:
                process.wait(_STOP_TIMEOUT_S / 2)
                return
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def stop(self) -> None:
        """:meth:`halt`, then remove the directory."""
        self.halt()
        shutil.rmtree(self.root, ignore_errors=True)


class TempPostgres(TempServer):
    """A fresh cluster; ``url`` connects as superuser ``postgres`` (trust auth)."""

    name = "postgres"

    def __init__(self, root: Path, command: list[str], port: int) -> None:
        super().__init__(root, command, port)
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    @classmethod
    def start(cls, *settings: str) -> TempPostgres:
        """Start a cluster; ``settings`` are more ``name=value`` server settings.

        Raises:
            ServerUnavailable: no binary, initdb failed, or the server would not start.
        """
        bin_dir = _postgres_bin_dir()
        root = Path(tempfile.mkdtemp(prefix="orbit-pg-"))
        try:
            prefix = unprivileged(root)
            _initdb(prefix, bin_dir, root)
            port = free_port()
            command = [*prefix, str(bin_dir / "postgres"), "-D", str(root / "data")]
            command += ["-p", str(port), "-h", "127.0.0.1", "-k", str(root)]
            command += [arg for s in (*POSTGRES_SETTINGS, *settings) for arg in ("-c", s)]
            server = cls(root, command, port)
            server._run(lambda: _accepts(server.url))
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return server

    @contextlib.contextmanager
    def schema_url(self, prefix: str) -> Iterator[str]:
        """A URL of this cluster whose ``search_path`` is a new schema named ``prefix``
        and random hex, dropped (with all it holds) when the block ends."""
        schema = f"{prefix}{secrets.token_hex(6)}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        try:
            yield f"{self.url}?options=-csearch_path%3D{schema}"
        finally:
            with psycopg.connect(self.url, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")


def _accepts(url: str) -> bool:
    """Whether a PostgreSQL (or PgBouncer) server at ``url`` takes a connection now."""
    try:
        psycopg.connect(url, connect_timeout=2).close()
    except psycopg.OperationalError:
        return False
    return True


def _postgres_bin_dir() -> Path:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if found := shutil.which("initdb"):
        candidates.append(found)
    for initdb in candidates:
        if (Path(initdb).parent / "postgres").exists():
            return Path(initdb).parent
    raise ServerUnavailable("no initdb/postgres binary found (install postgresql)")


def _initdb(prefix: list[str], bin_dir: Path, root: Path) -> None:
    command = [*prefix, str(bin_dir / "initdb"), "-D", str(root / "data")]
    command += ["-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"]
    env = dict(os.environ, LC_ALL="C", LANG="C")
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, check=False)
    if done.returncode != 0:
        output = (done.stdout + done.stderr).decode(errors="replace")[-2000:]
        raise ServerUnavailable(f"initdb failed ({done.returncode}): {output}")


class TempRedis(TempServer):
    """A redis-server, without persistence unless started with ``appendonly=True``: ``url``
    over TCP, ``unix_url`` over its socket, ``tls_url`` (certificate not verified) when
    started with ``tls=True``."""

    name = "redis-server"

    def __init__(self, root: Path, command: list[str], port: int, tls_port: int | None) -> None:
        super().__init__(root, command, port)
        self.socket_path = root / "redis.sock"
        self.url = f"redis://127.0.0.1:{port}/0"
        self.unix_url = f"unix://{self.socket_path}"
        self.tls_url = None if tls_port is None else f"rediss://127.0.0.1:{tls_port}/0"

    @classmethod
    def start(cls, *, tls: bool = False, appendonly: bool = False) -> TempRedis:
        """Start a server (with a self-signed TLS port when ``tls``; an append-only file,
        synced every second, when ``appendonly``).

        Raises:
            ServerUnavailable: no binary (or no openssl for ``tls``), or it would not start.
        """
        binary = shutil.which("redis-server")
        if binary is None:
            raise ServerUnavailable("no redis-server binary found (install redis-server)")
        root = Path(tempfile.mkdtemp(prefix="orbit-redis-"))
        try:
            port = free_port()
            command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
            command += ["--appendonly", "yes" if appendonly else "no", "--dir", str(root)]
            command += ["--unixsocket", str(root / "redis.sock"), "--unixsocketperm", "700"]
            tls_port = free_port() if tls else None
            if tls_port is not None:
                command += _tls_options(root, tls_port)
            server = cls(root, command, port, tls_port)
            server._run(server._answers)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return server

    def restart(self) -> None:
        """Stop the server if it runs, start it again on the same ports (with its data only
        when it keeps an append-only file).

        Raises:
            ServerUnavailable: it will not start again.
        """
        self.halt()
        self._run(self._answers)

    def _answers(self) -> bool:
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2.0)
        try:
            client.ping()
        except redis.RedisError:
            return False
        finally:
            client.close()
        return True


def _tls_options(root: Path, port: int) -> list[str]:
    """redis-server options serving TLS on ``port`` with a fresh self-signed certificate."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ServerUnavailable("no openssl binary to make a test certificate (install openssl)")
    cert, key = root / "cert.pem", root / "key.pem"
    command = [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    command += ["-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)]
    done = subprocess.run(command, capture_output=True, check=False)
    if done.returncode != 0:
        raise ServerUnavailable(f"openssl failed: {done.stderr.decode(errors='replace')[-600:]}")
    return ["--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"]  # fmt: skip


class TempPgBouncer(TempServer):
    """PgBouncer in front of a :class:`TempPostgres`: ``url`` reaches its ``postgres``
    database through the bouncer (no server reset query between clients)."""

    name = "pgbouncer"

    def __init__(self, root: Path, command: list[str], port: int) -> None:
        super().__init__(root, command, port)
        self.url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    @classmethod
    def start(
        cls, postgres: TempPostgres, pool_size: int, mode: str = "transaction"
    ) -> TempPgBouncer:
        """Start PgBouncer with a pool of ``pool_size`` server connections in ``mode``.

        Raises:
            ServerUnavailable: no binary, or it would not start.
        """
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        if not Path(binary).exists():
            raise ServerUnavailable("pgbouncer not found (install pgbouncer)")
        root = Path(tempfile.mkdtemp(prefix="orbit-pgb-"))
        try:
            port = free_port()
            (root / "users.txt").write_text('"postgres" ""\n')
            (root / "pgbouncer.ini").write_text(
                f"[databases]\npostgres = host=127.0.0.1 port={postgres.port} dbname=postgres "
                "user=postgres\n[pgbouncer]\nlisten_addr = 127.0.0.1\n"
                f"listen_port = {port}\nauth_type = trust\nauth_file = {root}/users.txt\n"
                f"pool_mode = {mode}\ndefault_pool_size = {pool_size}\nmin_pool_size = 0\n"
                "reserve_pool_size = 0\nmax_client_conn = 1000\nunix_socket_dir =\n"
                "server_reset_query =\n"
            )
            command = [*unprivileged(root), binary, str(root / "pgbouncer.ini")]
            server = cls(root, command, port)
            server._run(lambda: _accepts(server.url))
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return server
