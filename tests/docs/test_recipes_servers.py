"""The gunicorn and uvicorn recipes of docs/recipes.md, on real servers (issue 12 item 6).

Each test starts the server exactly as the recipe says, with several workers on a
free loopback port and the SHM store of a fresh fleet, sends concurrent requests
to the handler that holds the named lock, and checks that one worker held it at
a time and that only the workers (never the master) took a node of the fleet.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .._fleets import new_fleet_name, remove_fleet_files
from ._recipes import (
    CAPACITY,
    assert_one_holder_at_a_time,
    free_port,
    get_all,
    live_nodes,
    recipe_env,
    started,
    write_recipes,
)

WORKERS = 3
REQUESTS = 8


@pytest.fixture
def fleet() -> Iterator[str]:
    name = new_fleet_name()
    yield name
    remove_fleet_files(name)


def test_gunicorn_preloaded_workers_join_in_post_fork_and_take_turns(
    tmp_path: Path, fleet: str
) -> None:
    write_recipes(tmp_path)
    port = free_port()
    command = [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"]
    command += ["-w", str(WORKERS), "-b", f"127.0.0.1:{port}", "--timeout", "30"]
    command += ["--no-control-socket"]  # no socket in the home directory, shared by runs
    env = recipe_env(tmp_path, f"shm://{fleet}?capacity={CAPACITY}")
    with started([*command, "web_app:app"], tmp_path, env, port) as master:
        done = get_all(f"http://127.0.0.1:{port}/", REQUESTS)
        pids = {one["pid"] for one in done}
        assert master.pid not in pids
        assert len(pids) >= 2  # a sync worker serves one request at a time
        assert live_nodes(fleet) == WORKERS  # the preloaded master took no node
    assert_one_holder_at_a_time(done)


def test_uvicorn_workers_hold_the_lock_with_lock_async(tmp_path: Path, fleet: str) -> None:
    write_recipes(tmp_path)
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", "asgi_app:app", "--workers", str(WORKERS)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--lifespan", "on"]
    env = recipe_env(tmp_path, f"shm://{fleet}?capacity={CAPACITY}")
    with started(command, tmp_path, env, port) as supervisor:
        done = get_all(f"http://127.0.0.1:{port}/", REQUESTS)
        assert supervisor.pid not in {one["pid"] for one in done}
        assert live_nodes(fleet) == WORKERS  # one node per worker, none for the supervisor
    assert_one_holder_at_a_time(done)
