"""Run the recipes of ``docs/recipes.md`` as written: their files, servers and checks.

:func:`write_recipes` takes every code block marked ``<!-- file: NAME -->`` out
of the document into a directory. :func:`started` runs a server in its own
session and always stops it: SIGTERM to the server, then SIGKILL to its whole
process group after a bound, so no worker outlives a test.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from orbitive import Fleet

ROOT: Final = Path(__file__).resolve().parents[2]
RECIPES: Final = ROOT / "docs" / "recipes.md"
_BLOCK: Final = re.compile(r"<!-- file: (\S+) -->\n```[a-z]*\n(.*?)```", re.DOTALL)
#: Seconds a server may take to start listening, or to stop after SIGTERM.
START_S: Final = 60.0
STOP_S: Final = 20.0
#: Fleet capacity of the recipes' ``shm://`` URLs.
CAPACITY: Final = 16


def write_recipes(directory: Path, document: Path = RECIPES) -> dict[str, str]:
    """Write each marked code block of ``document`` (the recipes by default) into
    ``directory``, making the folders a name has; name -> text."""
    files = dict(_BLOCK.findall(document.read_text()))
    for name, text in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return files


def recipe_env(directory: Path, store_url: str, **extra: str) -> dict[str, str]:
    """The environment of a recipe's process: its files importable, the store URL set."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return dict(os.environ, PYTHONPATH=str(directory), ORBIT_STORE=store_url, PATH=path, **extra)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def started(
    command: list[str], directory: Path, env: Mapping[str, str], port: int | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``command`` in ``directory`` until the block ends (listening on ``port`` first)."""
    log = (directory / "server.log").open("wb")
    process = subprocess.Popen(
        command,
        cwd=directory,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    try:
        if port is not None:
            _wait_listening(process, port, directory)
        yield process
    finally:
        _stop(process)


def _wait_listening(process: subprocess.Popen[bytes], port: int, directory: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1.0):
            return
        time.sleep(0.1)
    log = (directory / "server.log").read_text(errors="replace")[-3000:]
    raise AssertionError(f"server on port {port} did not start: {log}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(STOP_S)
    with contextlib.suppress(ProcessLookupError):  # the session's leftovers, by its group id
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(STOP_S)


def get_all(url: str, count: int) -> list[dict[str, Any]]:
    """``count`` concurrent GETs of ``url``; their JSON bodies."""

    def get(_: int) -> dict[str, Any]:
        with urllib.request.urlopen(url, timeout=30.0) as response:
            assert response.status == 200
            body: dict[str, Any] = json.loads(response.read())
            return body

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(get, range(count)))


def assert_one_holder_at_a_time(done: list[dict[str, Any]]) -> None:
    """No two holders' intervals overlap, and tokens grow in the order they held."""
    ordered = sorted(done, key=lambda one: one["start"])
    for before, after in itertools.pairwise(ordered):
        assert after["start"] >= before["end"], (before, after)
        assert after["token"] > before["token"], (before, after)


def live_nodes(fleet: str) -> int:
    """How many processes hold a node of ``fleet`` now, not counting this one."""
    with Fleet.join(fleet, capacity=CAPACITY) as member:
        return sum(member.is_alive(node) for node in range(CAPACITY)) - 1
