"""What a host's steward sends its budget's coordinator when nothing can change: a host
whose callers wait for units that every other unit of the total keeps from it."""

from __future__ import annotations

import secrets
import threading
import time

from orbitive import Fleet
from orbitive.clients import Budget, PoolOptions
from orbitive.clients.psycopg import ConnectionPool
from orbitive.store._url import open_engine

from .._servers import TempPostgres
from ._budget_hosts import wait_for

#: The budget's ttl, seconds: a host posts its numbers again at least every ttl / 4.
TTL = 10.0


def test_a_host_that_cannot_get_more_units_posts_only_when_its_units_or_need_change(
    fleet: Fleet, durable_postgres_server: TempPostgres
) -> None:
    """Six callers always busy and two that come and go make the host's clients in use
    and waiting move all the time, while it holds the whole total (2) and needs more
    (at least four callers want a client even while two are between requests).
    The other hosts decide by units held and need alone, so the host posts again only
    when they change, or after ttl / 4 to keep its post alive: each post takes a new
    slot of the posts' semaphore, whose fencing token grows by one per post."""
    db = durable_postgres_server.url
    budget = Budget(db, name=f"db-{secrets.token_hex(3)}", total=2, ttl=TTL)
    engine = open_engine(db)
    stop = threading.Event()

    def posts_so_far() -> int:
        return max((slot.fencing_token for slot in engine.holders(budget.posts_name)), default=0)

    def work(pause: float) -> None:
        while not stop.is_set():
            with pool.connection(timeout=30.0) as conn:
                conn.execute("SELECT pg_sleep(0.01)")
            time.sleep(pause)

    options = PoolOptions(max_live=8)
    pool = ConnectionPool(db, fleet=fleet, options=options, budget=budget)
    pauses = (0, 0, 0, 0, 0, 0, 0.03, 0.07)
    threads = [threading.Thread(target=work, args=(pause,)) for pause in pauses]
    try:
        for thread in threads:
            thread.start()
        wait_for(lambda: pool.statistics().budget_units == 2, 10.0)
        time.sleep(1.0)  # the post that says so is up
        first, started = posts_so_far(), time.monotonic()
        time.sleep(TTL / 4 - 0.3)
        posted, elapsed = posts_so_far() - first, time.monotonic() - started
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        pool.close()
        engine.close()
    assert elapsed < TTL / 4
    assert posted <= 1, f"{posted} posts in {elapsed:.1f} s with units and need unchanged"
