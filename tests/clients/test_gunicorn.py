"""Real gunicorn: 4 workers over the psycopg adapter share a host-wide cap of 3 connections."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from .._processes import ROOT
from ._sampling import ServerConnections
from .conftest import CAPACITY

CLIENT_THREADS = 8
REQUESTS_PER_THREAD = 40


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def gunicorn(fleet_name: str, pg_url: str, tag: str) -> Iterator[int]:
    """A running gunicorn (4 workers, max_live 3) on a free loopback port; stopped after."""
    port = _free_port()
    env = dict(
        os.environ,
        ORBIT_TEST_BIND=f"127.0.0.1:{port}",
        ORBIT_TEST_FLEET=fleet_name,
        ORBIT_TEST_CAPACITY=str(CAPACITY),
        ORBIT_TEST_PG_URL=pg_url,
        ORBIT_TEST_TAG=tag,
        ORBIT_TEST_MAX_LIVE="3",
    )
    command = [sys.executable, "-m", "gunicorn", "-c", "tests/clients/_gunicorn_conf.py"]
    server = subprocess.Popen([*command, "tests.clients._wsgi_app:app"], cwd=ROOT, env=env)
    try:
        _wait_serving(port, server)
        yield port
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(30)


def _wait_serving(port: int, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert server.poll() is None, "gunicorn exited"
        try:
            if _get(port)[0] == 200:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, "gunicorn did not serve within 60 s"
        time.sleep(0.1)


def _get(port: int) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/")
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def test_gunicorn_workers_serve_every_request_within_three_server_connections(
    gunicorn: int, pg_url: str, tag: str
) -> None:
    statuses: Counter[int] = Counter()
    workers: Counter[str] = Counter()
    failures: list[str] = []
    lock = threading.Lock()

    def load() -> None:
        for _ in range(REQUESTS_PER_THREAD):
            try:
                status, body = _get(gunicorn)
            except OSError as error:
                with lock:
                    failures.append(repr(error))
                continue
            with lock:
                statuses[status] += 1
                workers[body.split()[0]] += 1

    with ServerConnections(pg_url, tag) as server:
        threads = [threading.Thread(target=load) for _ in range(CLIENT_THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    assert failures == []
    assert statuses == {200: CLIENT_THREADS * REQUESTS_PER_THREAD}
    assert len(workers) >= 2  # the requests really spread over several workers
    assert server.samples > 10
    assert 1 <= server.highest <= 3, server.highest
