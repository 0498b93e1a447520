"""Run the docs' pages as programs, one after another, in the order given.

``python -m tests.docs._site_run pages WORK PAGE...`` runs each page in a folder of
its own under ``WORK``, each in a fresh interpreter (``page PAGE FOLDER``), and stops
at the first that fails. It is started inside a private mount namespace
(:func:`tests.docs.test_site_examples.in_private_shm`): its own ``/dev/shm``, and an
``/etc/hosts`` where ``db`` and ``cache`` are this machine. So the pages meet each
other's fleets and leases, never another test run's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ._site import Block, blocks, on_free_port, page_path
from ._standins import STANDINS

#: Seconds one page's program may take, and a server to start or stop.
PAGE_S = 180.0
START_S = 60.0
STOP_S = 20.0
#: Seconds between the SIGTERMs sent to a stopping server's process group: a gunicorn
#: worker still in its post_fork when the first one comes takes it with the master's
#: handler, which only queues it, and would serve on until the SIGKILL at STOP_S.
TERM_EVERY_S = 1.0
#: Requests sent to a started server, each of which must answer 200.
REQUESTS = 4


def run_pages(work: Path, pages: list[str]) -> int:
    for index, page in enumerate(pages):
        folder = work / f"{index:02d}-{page.replace('/', '-')}"
        folder.mkdir(parents=True)
        started = time.monotonic()
        command = [sys.executable, "-m", "tests.docs._site_run", "page", page, str(folder)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=PAGE_S, check=False)
        seconds = time.monotonic() - started
        if done.returncode != 0:
            print(f"{page}: FAILED after {seconds:.1f} s\n{done.stdout}{done.stderr}", flush=True)
            return 1
        print(f"{page}: ok ({seconds:.1f} s)", flush=True)
    return 0


def run_page(page: str, folder: Path) -> None:
    """The page's program: its files written, then its blocks in order."""
    found = blocks(page_path(page))
    for block in found:
        if block.marker == "file":
            path = folder / block.argument
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.code)
    os.chdir(folder)
    sys.path.insert(0, str(folder))
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(STANDINS.get(page, ""), namespace)
    for block in found:
        if block.marker in {"file", "not-run"} or block.language == "text":
            continue
        print(f"-- {block.where} ({block.language}{' server' if block.marker else ''})")
        if block.marker == "server":
            _serve(block, folder)
        elif block.language == "python":
            exec(compile(block.code, block.where, "exec"), namespace)
        elif block.language == "sh":
            subprocess.run(["bash", "-e", "-c", block.code], check=True, timeout=PAGE_S)
        elif block.language == "sql":
            _sql(block.code)
        else:
            raise AssertionError(f"{block.where}: no way to run a {block.language!r} block")


def _sql(code: str) -> None:
    import psycopg  # noqa: PLC0415 - only the pages with SQL need it

    with psycopg.connect("postgresql://postgres@db/postgres", autocommit=True) as conn:
        conn.execute(code.encode())


def _serve(block: Block, folder: Path) -> None:
    """Start the server as the block says, on a free port; its URL must answer 200."""
    port = _free_port()
    url = on_free_port(block.argument, port)
    log = (folder / "server.log").open("wb")
    process = subprocess.Popen(
        ["bash", "-c", on_free_port(block.code, port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_answering(process, url)
        for _ in range(REQUESTS):
            with urllib.request.urlopen(url, timeout=30.0) as response:
                assert response.status == 200, response.status
    except BaseException:
        print((folder / "server.log").read_text(errors="replace")[-4000:])
        raise
    finally:
        _stop(process)


def _wait_answering(process: subprocess.Popen[bytes], url: str) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with status {process.returncode}")
        with (
            contextlib.suppress(OSError, urllib.error.URLError),
            urllib.request.urlopen(url, timeout=5.0),
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer within {START_S} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group every TERM_EVERY_S until its leader exits,
    then SIGKILL to whatever the group still holds (all of it, at STOP_S)."""
    deadline = time.monotonic() + STOP_S
    while process.poll() is None and (left := deadline - time.monotonic()) > 0:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(min(TERM_EVERY_S, left))
    with contextlib.suppress(ProcessLookupError):  # whatever the session left, by group id
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(STOP_S)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def main(argv: list[str]) -> int:
    if argv[0] == "pages":
        return run_pages(Path(argv[1]), argv[2:])
    run_page(argv[1], Path(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
