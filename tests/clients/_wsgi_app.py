"""A small WSGI app over the psycopg adapter, for the real-gunicorn test.

Each worker joins the fleet in gunicorn's ``post_fork`` hook (see
``_gunicorn_conf.py``), never in the preloaded master. Settings come from the
environment the test sets.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from orbitive import Fleet
from orbitive.clients import PoolOptions
from orbitive.clients.psycopg import ConnectionPool

_state: dict[str, Any] = {}


def start() -> None:
    """Join the fleet and build this worker's pool (called in post_fork)."""
    fleet = Fleet.join(os.environ["ORBIT_TEST_FLEET"], int(os.environ["ORBIT_TEST_CAPACITY"]))
    _state["fleet"] = fleet
    _state["pool"] = ConnectionPool(
        os.environ["ORBIT_TEST_PG_URL"],
        fleet=fleet,
        kwargs={"application_name": os.environ["ORBIT_TEST_TAG"]},
        options=PoolOptions(max_live=int(os.environ["ORBIT_TEST_MAX_LIVE"])),
    )


def stop() -> None:
    """Close the pool and leave the fleet (called in worker_exit)."""
    pool = _state.pop("pool", None)
    if pool is not None:
        pool.close()
    fleet = _state.pop("fleet", None)
    if fleet is not None:
        fleet.close()


def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Answer ``{worker pid} {server backend pid}`` from one query."""
    pool: ConnectionPool = _state["pool"]
    with pool.connection() as conn:
        row = conn.execute("SELECT pg_backend_pid(), pg_sleep(0.002)").fetchone()
    assert row is not None
    body = f"{os.getpid()} {row[0]}\n".encode()
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
