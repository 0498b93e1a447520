"""A real, throw-away redis-server for tests and benchmarks.

``TempRedis.start()`` finds ``redis-server`` on the PATH, starts it without
persistence on a free port of 127.0.0.1 (and on a Unix socket in a fresh
temporary directory) and waits until it answers PING. ``start(tls=True)`` also
serves TLS on a second port, with a self-signed certificate made by ``openssl``.
``stop()`` shuts it down (SIGTERM, then SIGKILL) and removes the directory.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Final

import redis

_START_TIMEOUT_S: Final = 30.0


class RedisUnavailable(Exception):
    """No server binary, or the server would not start; the message says why."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class TempRedis:
    """One running server: ``url`` over TCP, ``unix_url`` over its Unix socket."""

    def __init__(self, root: Path, command: list[str], port: int, tls_port: int | None) -> None:
        self.root = root
        self.command = command
        self.process: subprocess.Popen[bytes] | None = None
        self.port = port
        self.socket_path = root / "redis.sock"
        self.url = f"redis://127.0.0.1:{port}/0"
        self.unix_url = f"unix://{self.socket_path}"
        #: ``rediss://`` URL of the TLS port (certificate not verified), if started.
        self.tls_url = None if tls_port is None else f"rediss://127.0.0.1:{tls_port}/0"

    @classmethod
    def start(cls, *, tls: bool = False) -> TempRedis:
        """Start a server. Raises RedisUnavailable with the reason."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RedisUnavailable("no redis-server binary found (install redis-server)")
        root = Path(tempfile.mkdtemp(prefix="orbit-redis-"))
        port = _free_port()
        command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        command += ["--appendonly", "no", "--dir", str(root)]
        command += ["--unixsocket", str(root / "redis.sock"), "--unixsocketperm", "700"]
        tls_port = _free_port() if tls else None
        if tls_port is not None:
            command += _tls_options(root, tls_port)
        server = cls(root, command, port, tls_port)
        try:
            server._run()
        except BaseException:
            server.stop()
            raise
        return server

    def restart(self) -> None:
        """Stop the server if it runs (it keeps no data) and start it again on the same ports.

        Raises RedisUnavailable when it will not start again.
        """
        self.halt()
        self._run()

    def _run(self) -> None:
        with (self.root / "server.log").open("ab") as log:
            self.process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, cwd=self.root
            )
        self._wait_ready(self.process)

    def _wait_ready(self, process: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2.0)
        try:
            while True:
                if process.poll() is not None:
                    raise RedisUnavailable(f"redis-server exited: {self.log_tail()}")
                try:
                    client.ping()
                    return
                except redis.RedisError:
                    if time.monotonic() > deadline:
                        tail = self.log_tail()
                        raise RedisUnavailable(f"redis-server did not start: {tail}") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def log_tail(self) -> str:
        """The last lines of the server log."""
        try:
            return (self.root / "server.log").read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM, SIGKILL after 10 s, then remove the directory."""
        self.halt()
        shutil.rmtree(self.root, ignore_errors=True)

    def halt(self) -> None:
        """Stop the server process (SIGTERM, SIGKILL after 10 s) and keep its directory."""
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _tls_options(root: Path, port: int) -> list[str]:
    """redis-server options serving TLS on ``port`` with a fresh self-signed certificate."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RedisUnavailable("no openssl binary to make a test certificate (install openssl)")
    cert, key = root / "cert.pem", root / "key.pem"
    command = [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    command += ["-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)]
    done = subprocess.run(command, capture_output=True, check=False)
    if done.returncode != 0:
        raise RedisUnavailable(f"openssl failed: {done.stderr.decode(errors='replace')[-600:]}")
    return [
        "--tls-port",
        str(port),
        "--tls-cert-file",
        str(cert),
        "--tls-key-file",
        str(key),
        "--tls-ca-cert-file",
        str(cert),
        "--tls-auth-clients",
        "no",
    ]
