"""The psycopg adapter behaves as psycopg_pool does: each scenario runs on both and compares.

A scenario takes a pool (psycopg_pool's, or ``orbitive.clients.psycopg``'s, built
from the same arguments by :class:`Pools`) and returns what an application sees:
values, error classes, messages. Each test runs one scenario on both pools and
asserts the two observations are equal. The differences kept on purpose are
tested at the end, on our pool alone.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import psycopg
import psycopg_pool
import pytest

from orbitive import Fleet
from orbitive.clients import InvalidPoolOptions, PoolOptions
from orbitive.clients import PoolTimeout as OrbitPoolTimeout
from orbitive.clients.psycopg import AsyncConnectionPool, ConnectionPool

IMPLEMENTATIONS = ("psycopg_pool", "orbitive")
#: A port nothing listens on (connects are refused at once).
REFUSED_URL = "postgresql://nobody@127.0.0.1:9/none?connect_timeout=1"


class Pools:
    """Builds pools of either implementation from psycopg_pool's arguments, and closes them.

    ``size`` is psycopg_pool's ``max_size`` and our ``max_live`` (and ``max_idle``);
    ``floor`` is psycopg_pool's ``min_size`` and our ``min_idle``.
    """

    def __init__(self, fleet: Fleet, url: str, tag: str) -> None:
        self.fleet, self.url, self.tag = fleet, url, tag
        self.made: list[Any] = []

    def make(
        self, impl: str, size: int = 2, floor: int = 0, url: str | None = None, **common: Any
    ) -> Any:
        common.setdefault("kwargs", {"application_name": self.tag})
        common.setdefault("check", None)  # psycopg_pool's default
        common.setdefault("open", True)
        pool: Any
        if impl == "psycopg_pool":
            pool = psycopg_pool.ConnectionPool(
                url or self.url, min_size=floor, max_size=size, **common
            )
        else:
            options = PoolOptions(max_live=size, min_idle=floor, max_idle=size)
            pool = ConnectionPool(url or self.url, fleet=self.fleet, options=options, **common)
        self.made.append(pool)
        return pool

    def close(self) -> None:
        for pool in self.made:
            pool.close()


@pytest.fixture
def pools(fleet: Fleet, pg_url: str, tag: str) -> Iterator[Pools]:
    made = Pools(fleet, pg_url, tag)
    yield made
    made.close()


@pytest.fixture
def table(pg_url: str) -> Iterator[str]:
    """A table of one int column, of this test only."""
    name = f"fidelity_{secrets.token_hex(4)}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (n int)")
        yield name
        conn.execute(f"DROP TABLE {name}")


def both(scenario: Callable[[Any], object], make: Callable[[str], Any]) -> list[object]:
    """The scenario's observation on each implementation's pool, psycopg_pool's first."""
    return [scenario(make(impl)) for impl in IMPLEMENTATIONS]


def same(observations: list[object]) -> object:
    """The one observation both implementations made (they must agree)."""
    assert observations[0] == observations[1], dict(zip(IMPLEMENTATIONS, observations, strict=True))
    return observations[0]


def _count(pool: Any, table: str) -> int:
    with pool.connection() as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def test_connection_commits_a_clean_block_and_rolls_back_a_failing_one(
    pools: Pools, table: str
) -> None:
    def scenario(pool: Any) -> object:
        with pool.connection() as conn:
            conn.execute(f"INSERT INTO {table} VALUES (1)")
        committed = _count(pool, table)
        with pytest.raises(ZeroDivisionError), pool.connection() as conn:
            conn.execute(f"INSERT INTO {table} VALUES (2)")
            _ = 1 / 0
        rolled_back = _count(pool, table)
        with pool.connection() as conn:
            conn.execute(f"DELETE FROM {table}")
        return committed, rolled_back

    assert same(both(scenario, pools.make)) == (1, 1)


def test_the_connections_own_with_inside_connection_keeps_it_open_and_pooled(
    pools: Pools,
) -> None:
    def scenario(pool: Any) -> object:
        with pool.connection() as conn:
            with conn:
                conn.execute("SELECT 1")
            inner_closed = conn.closed
            again = conn.execute("SELECT 2").fetchone()[0]
        with pool.connection() as second:
            reused = second is conn
        return inner_closed, again, reused, pool.get_stats()["pool_available"]

    assert same(both(scenario, lambda impl: pools.make(impl, size=1))) == (False, 2, True, 1)


def test_putconn_rolls_back_an_open_transaction(pools: Pools, table: str) -> None:
    def scenario(pool: Any) -> object:
        conn = pool.getconn()
        conn.execute(f"INSERT INTO {table} VALUES (1)")
        pool.putconn(conn)
        again = pool.getconn()
        status = again.info.transaction_status
        pool.putconn(again)
        return _count(pool, table), status, type(conn).__name__

    assert same(both(scenario, pools.make)) == (0, psycopg.pq.TransactionStatus.IDLE, "Connection")


def test_a_timeout_is_psycopg_pools_pool_timeout(pools: Pools) -> None:
    def scenario(pool: Any) -> object:
        held = pool.getconn()
        began = time.monotonic()
        try:
            pool.getconn(timeout=0.3)
        except psycopg_pool.PoolTimeout as error:
            caught: Exception = error
        waited = time.monotonic() - began
        pool.putconn(held)
        return (
            isinstance(caught, psycopg.OperationalError),
            0.25 <= waited <= 3.0,
            pool.get_stats().get("requests_errors"),
        )

    assert same(both(scenario, lambda impl: pools.make(impl, size=1))) == (True, True, 1)


def test_our_timeout_is_also_orbitives_and_a_timeout_error(pools: Pools) -> None:
    pool = pools.make("orbitive", size=1)
    with pool.connection(), pytest.raises(OrbitPoolTimeout) as caught:
        pool.getconn(timeout=0.1)
    assert isinstance(caught.value, TimeoutError)
    assert isinstance(caught.value, psycopg_pool.PoolTimeout)
    assert pool.name in str(caught.value)  # the key's label names the database


def test_a_caller_beyond_max_waiting_gets_too_many_requests(pools: Pools) -> None:
    def scenario(pool: Any) -> object:
        held = pool.getconn()
        waiter = threading.Thread(target=lambda: pool.putconn(pool.getconn(timeout=10.0)))
        waiter.start()
        deadline = time.monotonic() + 10.0
        while pool.get_stats()["requests_waiting"] < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        began = time.monotonic()
        try:
            pool.getconn(timeout=10.0)
        except psycopg_pool.TooManyRequests as error:
            caught: Exception = error
        quick = time.monotonic() - began < 1.0
        pool.putconn(held)
        waiter.join()
        return isinstance(caught, psycopg.OperationalError), quick

    made = both(scenario, lambda impl: pools.make(impl, size=1, max_waiting=1))
    assert same(made) == (True, True)


def test_a_closed_pool_refuses_checkouts_and_cannot_be_reopened(pools: Pools) -> None:
    def scenario(pool: Any) -> object:
        with pool.connection():
            pass
        was_closed = pool.closed
        pool.close()
        pool.close()  # idempotent
        with pytest.raises(psycopg_pool.PoolClosed) as getting:
            pool.getconn()
        with pytest.raises(psycopg_pool.PoolClosed) as opening:
            pool.open()
        return was_closed, pool.closed, str(getting.value), str(opening.value)

    observed = same(both(scenario, lambda impl: pools.make(impl, name="fidelity")))
    assert observed == (
        False,
        True,
        "the pool 'fidelity' is already closed",
        "pool has already been opened/closed and cannot be reused",
    )


def test_a_pool_made_with_open_false_opens_on_open_or_with(pools: Pools) -> None:
    def scenario(pool: Any) -> object:
        closed = pool.closed
        with pytest.raises(psycopg_pool.PoolClosed) as caught:
            pool.getconn()
        with pool:
            with pool.connection() as conn:
                value = conn.execute("SELECT 7").fetchone()[0]
            opened = not pool.closed
        return closed, str(caught.value), value, opened, pool.closed

    observed = same(both(scenario, lambda impl: pools.make(impl, open=False, name="lazy")))
    assert observed == (True, "the pool 'lazy' is not open yet", 7, True, True)


def test_name_and_the_stats_keys(pools: Pools) -> None:
    def scenario(pool: Any) -> object:
        pool.wait(timeout=10.0)
        for _ in range(3):
            with pool.connection() as conn:
                conn.execute("SELECT 1")
        held = [pool.getconn()]
        with pytest.raises(psycopg_pool.PoolTimeout):
            pool.getconn(timeout=0.1)
        pool.putconn(held[0])
        stats = pool.get_stats()
        counters = {k: stats[k] for k in ("requests_num", "requests_errors", "requests_queued")}
        popped = pool.pop_stats()
        after = pool.get_stats()
        return (
            pool.name,
            sorted(stats),
            counters,
            popped["requests_num"],
            sorted(k for k in after if k.startswith("requests")),
            (after["pool_min"], after["pool_max"]),
        )

    observed = same(both(scenario, lambda impl: pools.make(impl, size=1, floor=1, name="stats")))
    name, keys, counters, popped, after, sizes = cast(tuple[Any, ...], observed)
    assert name == "stats"
    assert set(keys) >= {"pool_min", "pool_max", "pool_size", "pool_available"}
    assert {"requests_waiting", "usage_ms", "requests_wait_ms"} <= set(keys)
    assert counters == {"requests_num": 5, "requests_errors": 1, "requests_queued": 1}
    assert (popped, after, sizes) == (5, ["requests_waiting"], (1, 1))


def test_putconn_of_a_connection_from_elsewhere_is_a_value_error(pools: Pools) -> None:
    def scenario(pool: Any) -> object:
        with psycopg.connect(pools.url) as stranger, pytest.raises(ValueError):
            pool.putconn(stranger)
        return stranger.closed

    assert same(both(scenario, pools.make)) is True


def test_wait_for_a_floor_it_cannot_reach_closes_the_pool_and_times_out(pools: Pools) -> None:
    def scenario(pool: Any) -> object:
        with pytest.raises(psycopg_pool.PoolTimeout) as caught:
            pool.wait(timeout=0.5)
        return str(caught.value), pool.closed

    made = both(scenario, lambda impl: pools.make(impl, floor=1, url=REFUSED_URL, kwargs={}))
    assert same(made) == ("pool initialization incomplete after 0.5 sec", True)


def test_check_closes_an_idle_connection_the_server_ended(pools: Pools) -> None:
    def scenario(pool: Any) -> object:
        with pool.connection() as conn:
            pid = conn.info.backend_pid
        with psycopg.connect(pools.url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])
            while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
                time.sleep(0.01)
        pool.check()
        lost = pool.get_stats().get("connections_lost")
        with pool.connection() as conn:
            fresh = conn.info.backend_pid != pid and conn.execute("SELECT 3").fetchone()[0]
        return lost, fresh

    assert same(both(scenario, lambda impl: pools.make(impl, size=1))) == (1, 3)


def test_close_returns_hands_a_closed_connection_back(pools: Pools) -> None:
    def scenario(pool: Any) -> object:
        conn = pool.getconn()
        conn.close()
        returned = pool.get_stats()["pool_available"]
        with pool.connection() as again:
            reused = again is conn
        return conn.closed, returned, reused

    made = both(scenario, lambda impl: pools.make(impl, size=1, close_returns=True))
    assert same(made) == (False, 1, True)


# -- asyncio ----------------------------------------------------------------------------------


class AsyncPools:
    """:class:`Pools` for the asyncio pools (psycopg_pool's opened by ``open()``, as it asks)."""

    def __init__(self, pools: Pools) -> None:
        self.pools = pools
        self.made: list[Any] = []

    async def make(self, impl: str, size: int = 1, **common: Any) -> Any:
        common.setdefault("kwargs", {"application_name": self.pools.tag})
        common.setdefault("check", None)
        pool: Any
        if impl == "psycopg_pool":
            pool = psycopg_pool.AsyncConnectionPool(
                self.pools.url, min_size=0, max_size=size, open=False, **common
            )
        else:
            options = PoolOptions(max_live=size, max_idle=size)
            pool = AsyncConnectionPool(
                self.pools.url, fleet=self.pools.fleet, options=options, open=False, **common
            )
        self.made.append(pool)
        await pool.open()
        return pool


def test_asyncio_pools_commit_time_out_and_close_alike(pools: Pools, table: str) -> None:
    async def scenario(made: AsyncPools, impl: str) -> object:
        pool = await made.make(impl, name="async")
        async with pool.connection() as conn:
            await conn.execute(f"INSERT INTO {table} VALUES (1)")
        async with pool.connection() as conn:
            count = (await (await conn.execute(f"SELECT count(*) FROM {table}")).fetchone())[0]
            await conn.execute(f"DELETE FROM {table}")
            try:
                await pool.getconn(timeout=0.2)
            except psycopg_pool.PoolTimeout as error:
                timed_out: Exception = error
        await pool.close()
        with pytest.raises(psycopg_pool.PoolClosed) as caught:
            await pool.getconn()
        return count, isinstance(timed_out, psycopg.OperationalError), str(caught.value)

    async def run() -> list[object]:
        made = AsyncPools(pools)
        try:
            return [await scenario(made, impl) for impl in IMPLEMENTATIONS]
        finally:
            for pool in made.made:
                await pool.close()

    assert same(asyncio.run(run())) == (1, True, "the pool 'async' is already closed")


# -- the differences kept on purpose ----------------------------------------------------------


@pytest.mark.parametrize(
    ("argument", "equivalent"),
    [
        ({"min_size": 4}, "PoolOptions(min_idle=N)"),
        ({"max_size": 10}, "PoolOptions(max_live=N)"),
        ({"num_workers": 3}, "no worker threads"),
        ({"reconnect_timeout": 300.0}, "ClientCreateError"),
        ({"reconnect_failed": print}, "ClientCreateError"),
    ],
)
def test_a_psycopg_pool_argument_that_cannot_carry_over_names_the_host_wide_one(
    fleet: Fleet, pg_url: str, argument: dict[str, Any], equivalent: str
) -> None:
    with pytest.raises(InvalidPoolOptions) as caught:
        ConnectionPool(pg_url, fleet=fleet, **argument)
    assert equivalent in str(caught.value)
    assert caught.value.key == next(iter(argument))


def test_resize_cannot_carry_over_and_says_why(pools: Pools) -> None:
    pool = pools.make("orbitive")
    with pytest.raises(InvalidPoolOptions, match="max_live, min_idle and max_idle hold"):
        pool.resize(2, 4)
    assert (pool.min_size, pool.max_size) == (0, 2)  # read as min_idle and max_live


def test_psycopg_pools_timeouts_and_limits_set_the_options_with_their_meaning(
    fleet: Fleet, pg_url: str
) -> None:
    pool = ConnectionPool(
        pg_url, fleet=fleet, timeout=7.0, max_waiting=0, max_lifetime=60.0, max_idle=30.0
    )
    options = pool.options
    assert (options.acquire_timeout, options.max_lifetime, options.idle_timeout) == (
        7.0,
        60.0,
        30.0,
    )
    assert options.max_waiting == 2**32 - 1  # psycopg_pool's 0: no limit
    assert options.max_idle == options.max_live  # max_idle (seconds) is not the idle count
    pool.close()


def test_the_default_name_is_the_database_without_the_password(fleet: Fleet) -> None:
    pool = ConnectionPool(
        "postgresql://app:s3cret@db.example:6432/main", fleet=fleet, open=False, check=None
    )
    assert pool.name == "app@db.example:6432/main"
    keyword = ConnectionPool("host=/tmp dbname=x password=s3cret", fleet=fleet, open=False)
    assert keyword.name == "/tmp/x" and "s3cret" not in keyword.name
