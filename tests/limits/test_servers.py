"""The rate-limit recipes of docs/recipes.md under real servers (issue 33): flask-limiter
under gunicorn and slowapi under uvicorn, 4 workers each, a limit of 50 per minute on
one route.

Each test writes the recipe's files out of the page, starts its server with the
recipe's own command line (the application wrapped by :mod:`tests.limits._apps`, so
every answer names its worker; the storage and strategy set as the recipe reads them),
waits until all 4 workers have answered (on a path with no limit), then sends 500
GETs, each on a new connection, 16 at a time, from a loopback address of the test's
own (the recipes limit per client address, so no other test's counters count). On
``redis://`` and ``shm://`` exactly 50 are admitted and the other 450 answered 429
with the headers the framework sets; on ``memory://`` each worker counts alone, so
as many are admitted as the workers' own limits let through: more than 50, up to 200.
"""

from __future__ import annotations

import os
import random
import shlex
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Final

import pytest

from .._servers import TempRedis
from ..clients._http import Answer, get_each_anew
from ..docs._recipes import RECIPES, ROOT, free_port, started, write_recipes
from ..docs._site import blocks, on_free_port
from ._apps import PID_HEADER

pytestmark = pytest.mark.slow

WORKERS: Final = 4
LIMIT: Final = 50  # the recipes' limit per minute
REQUESTS: Final = 500
CONCURRENCY: Final = 16
#: Seconds the load may take: it starts early enough in a wall-clock minute to end in it
#: (a storage may align its windows to the minute: limits' sliding-window-counter on
#: memory:// does), and must end within it.
LOAD_BUDGET_S: Final = 25.0
STRATEGIES: Final = ("fixed-window", "moving-window", "sliding-window-counter")
ROWS: Final = [
    ("memory", "fixed-window"),
    *((storage, strategy) for storage in ("redis", "shm") for strategy in STRATEGIES),
]


@pytest.fixture
def storage_uri(request: pytest.FixtureRequest, fleet_name: str) -> str:
    """The storage of the row: ``memory://``, the session's Redis, or ``shm://`` on the
    test's own fleet (removed after the test, once its server has stopped)."""
    if request.param == "memory":
        return "memory://"
    if request.param == "redis":
        redis_server: TempRedis = request.getfixturevalue("redis_server")
        return redis_server.url
    return f"shm://{fleet_name}"


@pytest.fixture
def source() -> str:
    """A loopback address of this test's own, whose requests the limit counts."""
    return "127." + ".".join(str(random.randint(1, 254)) for _ in range(3))


def _recipe_command(app: str, wrapped: str, port: int) -> list[str]:
    """The recipe's server command serving ``app`` (its environment assignments left to
    the test), on ``port``, serving ``wrapped`` in its place, run by this interpreter."""
    (code,) = (b.code for b in blocks(RECIPES) if b.marker == "server" and app in b.code)
    words = shlex.split(on_free_port(code, port))
    while "=" in words[0]:
        words.pop(0)
    program, *arguments = words
    command = [sys.executable, "-m", program, *(wrapped if w == app else w for w in arguments)]
    if program == "gunicorn":
        command.append("--no-control-socket")  # none in the home directory, shared by runs
    return command


def _wait_for_every_worker(port: int, source: str, server_pid: int) -> None:
    """Until each of the workers has answered (404s on a path the recipe does not limit)."""
    seen: set[str] = set()
    deadline = time.monotonic() + 60
    while len(seen) < WORKERS:
        assert time.monotonic() < deadline, f"only workers {sorted(seen)} answered"
        answers = get_each_anew(port, "/unlimited", CONCURRENCY, concurrency=CONCURRENCY,
                                source=source)  # fmt: skip
        assert {answer.status for answer in answers} == {404}
        seen |= {answer.headers[PID_HEADER.lower()] for answer in answers}
    assert str(server_pid) not in seen


def _start_of_a_minute() -> None:
    """Wait for the next wall-clock minute if this one ends within the load's budget."""
    left = 60.0 - time.time() % 60.0
    if left < LOAD_BUDGET_S:
        time.sleep(left + 0.2)


def _load(
    app: str, wrapped: str, tmp_path: Path, storage_uri: str, strategy: str, source: str
) -> list[Answer]:
    """Serve the recipe ``app`` with 4 workers and send it the 500 GETs; their answers."""
    write_recipes(tmp_path)
    # The named-lock recipe's config, which gunicorn would load from the working directory
    # unasked and which opens its store (shm://web): these recipes do not use it.
    (tmp_path / "gunicorn.conf.py").unlink()
    port = free_port()
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
        RATELIMIT_STORAGE_URI=storage_uri,
        RATELIMIT_STRATEGY=strategy,
    )
    with started(_recipe_command(app, wrapped, port), tmp_path, env, port) as server:
        _wait_for_every_worker(port, source, server.pid)
        _start_of_a_minute()
        began = time.time()
        answers = get_each_anew(port, "/", REQUESTS, concurrency=CONCURRENCY, source=source)
        took = time.time() - began
    assert took < LOAD_BUDGET_S, f"the load took {took:.1f} s, over its {LOAD_BUDGET_S} s"
    assert len(answers) == REQUESTS
    return answers


def _check(answers: list[Answer], storage_uri: str) -> None:
    statuses = Counter(answer.status for answer in answers)
    by_worker = Counter(answer.headers[PID_HEADER.lower()] for answer in answers)
    admitted = Counter(a.headers[PID_HEADER.lower()] for a in answers if a.status == 200)
    shown = f"{dict(statuses)}; answered by worker {dict(by_worker)}, admitted {dict(admitted)}"
    print(f"{storage_uri}: {shown}")  # shown by pytest -rP
    assert set(statuses) <= {200, 429}, shown
    assert len(by_worker) >= 2, shown  # the 500 really spread over the workers
    if storage_uri == "memory://":
        # Each worker counts alone: it admits its first 50 and refuses the rest.
        assert admitted == {pid: min(served, LIMIT) for pid, served in by_worker.items()}, shown
        assert LIMIT < statuses[200] <= WORKERS * LIMIT, shown
    else:
        assert statuses == {200: LIMIT, 429: REQUESTS - LIMIT}, shown
    now = time.time()
    for answer in answers:
        if answer.status != 429:
            continue
        headers = answer.headers
        assert headers["x-ratelimit-limit"] == str(LIMIT), headers
        assert headers["x-ratelimit-remaining"] == "0", headers
        assert now - LOAD_BUDGET_S <= float(headers["x-ratelimit-reset"]) <= now + 62, headers
        assert 0 <= int(headers["retry-after"]) <= 61, headers


@pytest.mark.parametrize(("storage_uri", "strategy"), ROWS, indirect=["storage_uri"])
def test_flask_limiter_under_gunicorn_admits_50_of_500_across_4_workers(
    tmp_path: Path, storage_uri: str, strategy: str, source: str
) -> None:
    answers = _load("limited_flask:app", "tests.limits._apps:flask_app", tmp_path,
                    storage_uri, strategy, source)  # fmt: skip
    _check(answers, storage_uri)


@pytest.mark.parametrize(("storage_uri", "strategy"), ROWS, indirect=["storage_uri"])
def test_slowapi_under_uvicorn_admits_50_of_500_across_4_workers(
    tmp_path: Path, storage_uri: str, strategy: str, source: str
) -> None:
    answers = _load("limited_fastapi:app", "tests.limits._apps:fastapi_app", tmp_path,
                    storage_uri, strategy, source)  # fmt: skip
    _check(answers, storage_uri)
