"""PostgreSQL engine's asyncio form: recycled connections, a server gone, its own guard."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from orbitive.store import ErrorKind, StoreError, open_store
from orbitive.store._postgres_async import PostgresAsyncEngine

from .._servers import TempPostgres
from .test_postgres import kill_other_sessions


def test_an_async_lock_survives_its_connection_being_recycled(postgres_url: str) -> None:
    async def body() -> None:
        with open_store(postgres_url) as store:
            assert isinstance(store._backend.asyncio(), PostgresAsyncEngine)
            lock = await store.try_lock_async("survivor", "w1", 60.0)
            assert lock is not None
            assert kill_other_sessions(postgres_url) >= 2  # the sync and the async session
            assert await store.try_lock_async("survivor", "w2", 60.0) is None  # reconnected
            assert await lock.renew(60.0)
            assert kill_other_sessions(postgres_url) >= 1
            assert await lock.release()

    asyncio.run(body())


def test_server_down_is_unavailable_for_the_async_form(postgres_server: TempPostgres) -> None:
    server = TempPostgres.start()  # a server of its own, to stop (skips with the session's)

    async def body() -> None:
        store = open_store(server.url)
        try:
            lock = await store.try_lock_async("down", "w1", 60.0)
            assert lock is not None
            server.stop()
            with pytest.raises(StoreError) as caught:
                await lock.renew(60.0)
            assert caught.value.kind is ErrorKind.UNAVAILABLE
            assert isinstance(caught.value.__cause__, psycopg.OperationalError)
            assert not lock.lost  # unreachable is not lost: the handle may retry
        finally:
            store.close()

    try:
        asyncio.run(body())
    finally:
        server.stop()


def test_a_database_error_is_a_database_store_error(postgres_url: str) -> None:
    async def body() -> None:
        with open_store(postgres_url) as store:
            with pytest.raises(StoreError) as caught:
                await store._backend.asyncio().acquire("raw", "w1", 0.0)  # past the guard
            assert caught.value.kind is ErrorKind.DATABASE
            assert isinstance(caught.value.__cause__, psycopg.Error)
            assert store.inspect("raw") is None

    asyncio.run(body())
