"""The cost of a run-once lock per Celery task: orbitive.celery's ``Singleton`` on each
store engine beside celery-once's ``QueueOnce`` on Redis (issue 34).

Run: ``.venv/bin/python bench/celery_bench.py [--calls N]
[--engines shm,sqlite,postgres,redis] [--postgres URL]``. In one eager Celery app
(``task_always_eager``: ``delay`` runs the task in the calling process, so no broker
or worker time is counted, only the lock's), it times ``task.delay(i)`` with a new
``i`` each call (never a duplicate) for:

* a plain task (no lock): the baseline;
* a ``Singleton`` task in its default ``"queue"`` mode on each engine: the queue
  marker taken at ``delay``, the run lock taken and renewed by the renewer while the
  body runs, both released at its end;
* celery-once's ``QueueOnce`` on the same throw-away ``redis-server``: one
  ``SET NX`` at ``delay`` and one ``DEL`` after the body.

Calls are interleaved (one of each per round, after a warm-up of each) so that all
see the same machine load; it prints each median and its cost over the plain task's.
The servers and files are throw-away ones, as in ``bench/store_bench.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from celery import Celery
from celery_once import QueueOnce  # type: ignore[import-untyped]

from bench.store_bench import engine_url, interleaved_us
from orbitive import celery as orbit_celery
from orbitive.celery import Singleton
from tests._servers import TempRedis

ENGINES = ("shm", "sqlite", "postgres", "redis")


def _body(i: int) -> int:
    return i


def _app(redis_url: str) -> Celery:
    app = Celery("bench", set_as_current=False)
    app.conf.update(
        task_always_eager=True,
        task_eager_propagates=True,
        ONCE={
            "backend": "celery_once.backends.Redis",
            "settings": {"url": redis_url, "default_timeout": 3600},
        },
    )
    return app


def _calls(app: Celery, urls: dict[str, str]) -> dict[str, Callable[[], None]]:
    """One callable per row: each call delays its task with a new argument."""
    tasks: dict[str, Any] = {"plain task (no lock)": app.task(name="bench.plain")(_body)}
    for engine, url in urls.items():
        tasks[f"orbitive Singleton, {engine}"] = app.task(
            base=Singleton, name=f"bench.singleton.{engine}", store_url=url, unique_on=["i"]
        )(_body)
    once = app.task(base=QueueOnce, name="bench.once", once={"keys": ["i"]})
    tasks["celery-once QueueOnce, redis"] = once(_body)  # type: ignore[no-untyped-call]
    counter = iter(range(10**9))

    def caller(task: Any) -> Callable[[], None]:
        def call() -> None:
            task.delay(next(counter))

        return call

    return {row: caller(task) for row, task in tasks.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="timed calls of each row")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--postgres", help="a PostgreSQL URL (default: a throw-away server)")
    args = parser.parse_args()
    engines = [engine for engine in args.engines.split(",") if engine]
    redis_server = TempRedis.start()
    try:
        with contextlib.ExitStack() as stack:
            urls = {e: stack.enter_context(engine_url(e, args.postgres)) for e in engines}
            rows = _calls(_app(redis_server.url), urls)
            samples = interleaved_us(tuple(rows.values()), args.calls)
            with orbit_celery._stores_mutex:
                stores = list(orbit_celery._stores.values())
                orbit_celery._stores.clear()
            for store in stores:
                store.close()
    finally:
        redis_server.stop()
    medians = [statistics.median(times) for times in samples]
    print(f"{'row':<36} {'median':>12} {'lock cost':>12}")
    for row, median in zip(rows, medians, strict=True):
        print(f"{row:<36} {median:>9.1f} µs {median - medians[0]:>9.1f} µs")


if __name__ == "__main__":
    main()
