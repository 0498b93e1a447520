"""A README FastAPI example, as written, with what its test reads from inside a worker.

``ORBIT_TEST_EXAMPLE`` names the example's module (``app_asyncpg`` or
``app_sqlalchemy``). Added routes:

* ``/probe``: this worker's pid, the event loop's worst lag since the last
  ``?reset=1`` (a task that sleeps :data:`PERIOD_S` and measures how late it
  wakes; started by the first call), the worst lag net of the time the loop's
  thread ran on a CPU or stood runnable in the kernel's run queue meanwhile
  (``blocked``: the time the loop's thread slept in the kernel, as a blocking
  call makes it sleep, apart from a burst of ready requests that keeps the loop
  busy or a machine whose other processes keep both CPUs busy), and the key's
  fleet-wide counts;
* ``/slow``: one use of the example's pool running ``pg_sleep(0.02)``: a load of
  these waits for the cap while the CPU stays mostly idle, so a late probe there
  means a blocked loop, not a busy one;
* ``/cancelled/{when}``: one use of the example's pool under ``asyncio.wait_for``,
  cancelled after ``timeout_ms``: ``wait`` holds nothing but the checkout,
  ``query`` runs ``pg_sleep(0.05)`` on the connection.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from typing import Any, Final

from fastapi import FastAPI

from orbitive.clients import PoolClosed

example = importlib.import_module(os.environ["ORBIT_TEST_EXAMPLE"])
app: FastAPI = example.app
#: Seconds the probe task sleeps between two measures.
PERIOD_S: Final = 0.005
_worst = {"lag": 0.0, "blocked": 0.0}
_probe: list[asyncio.Task[None]] = []


def _scheduled_s() -> float:
    """Seconds this thread has run on a CPU or waited, runnable, for one (``/proc`` schedstat)."""
    with open("/proc/thread-self/schedstat") as stat:
        on_cpu, run_queue, _ = stat.read().split()
        return (int(on_cpu) + int(run_queue)) / 1e9


async def _measure() -> None:
    loop = asyncio.get_running_loop()
    while True:
        start, scheduled = loop.time(), _scheduled_s()
        await asyncio.sleep(PERIOD_S)
        lag = loop.time() - start - PERIOD_S
        _worst["lag"] = max(_worst["lag"], lag)
        _worst["blocked"] = max(_worst["blocked"], lag - (_scheduled_s() - scheduled))


def _counts() -> dict[str, int]:
    state = app.state
    try:
        clients = state.db.clients if hasattr(state, "db") else state.engine.pool.clients
    except PoolClosed:  # the engine's pool opens at its first checkout
        return {"live": 0, "in_use": 0, "waiting": 0}
    stats = clients.statistics()
    return {"live": stats.live, "in_use": stats.in_use, "waiting": stats.waiting}


@app.get("/probe")
async def probe(reset: int = 0) -> dict[str, Any]:
    if not _probe:
        _probe.append(asyncio.get_running_loop().create_task(_measure()))
    if reset:
        _worst.update(lag=0.0, blocked=0.0)
    return {"pid": os.getpid(), **_worst, **_counts()}


async def _use(seconds: float) -> None:
    """One checkout of the example's pool, sleeping ``seconds`` on the server (0: none)."""
    state = app.state
    if hasattr(state, "db"):
        async with state.db.acquire() as conn:
            if seconds:
                await conn.execute(f"SELECT pg_sleep({seconds})")
        return
    from sqlalchemy import text  # noqa: PLC0415 - the SQLAlchemy example's only

    async with state.engine.connect() as conn:
        if seconds:
            await conn.execute(text(f"SELECT pg_sleep({seconds})"))


@app.get("/slow")
async def slow() -> dict[str, bool]:
    await _use(0.02)
    return {"done": True}


@app.get("/cancelled/{when}")
async def cancelled(when: str, timeout_ms: float) -> dict[str, bool]:
    try:
        await asyncio.wait_for(_use(0.05 if when == "query" else 0.0), timeout_ms / 1000)
    except asyncio.TimeoutError:
        return {"cancelled": True}
    return {"cancelled": False}
