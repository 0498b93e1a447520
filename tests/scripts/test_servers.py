"""The suite's throw-away servers (tests/_servers.py) end with the process that started
them, however it ends: a suite killed by SIGTERM or SIGKILL runs no teardown, and its
servers' tethers stop them and remove their directories."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .._servers import ServerUnavailable, TempRedis

ROOT = Path(__file__).resolve().parents[2]
#: A stand-in for the suite: starts a Redis server, says where, and waits to be killed.
SUITE = """
import time
from tests._servers import ServerUnavailable, TempRedis
try:
    server = TempRedis.start()
except ServerUnavailable as error:
    print("unavailable", error, flush=True)
else:
    print(server.port, server.root, flush=True)
    time.sleep(600)
"""


def _answers(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_a_killed_suites_server_is_stopped_and_its_directory_removed() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", SUITE], cwd=ROOT, stdout=subprocess.PIPE, text=True
    ) as suite:
        assert suite.stdout is not None
        port, root = suite.stdout.readline().split(maxsplit=1)
        if port == "unavailable":  # as the session's servers: skipped, failed under CI
            (pytest.fail if os.environ.get("CI") else pytest.skip)(root)
        root = root.strip()
        assert _answers(int(port))
        suite.kill()
    deadline = time.monotonic() + 30
    while _answers(int(port)) or os.path.exists(root):
        assert time.monotonic() < deadline, "the server outlived the suite"
        time.sleep(0.05)


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # 3.12+: fork with threads
def test_a_server_stops_at_once_while_a_child_forked_since_lives() -> None:
    """A child forked after the server started holds the tether's pipe too; stopping
    the server neither waits for that child nor leaves its tether behind."""
    try:
        server = TempRedis.start()
    except ServerUnavailable as error:  # as the session's servers: skipped, failed under CI
        (pytest.fail if os.environ.get("CI") else pytest.skip)(str(error))
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    try:
        server.stop()
        assert os.waitpid(child, os.WNOHANG) == (0, 0)  # stopped while the child lives
        assert not _answers(server.port)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
