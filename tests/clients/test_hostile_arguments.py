"""The client pool's entry points under odd arguments: only their documented named errors.

The values of :mod:`tests._odd` (hostile hooks, ints past 4300 digits, lone
surrogates, released memoryviews) go to every argument a caller gives the client
pool, its options and its adapters, mixed with ordinary ones. Before, messages
built with ``repr`` let a hostile ``__repr__`` or a huge int escape as a plain
exception, and a released memoryview or a lone surrogate escaped from the
request and key paths.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbitive import Fleet
from orbitive.clients import (
    ClientPool,
    InvalidPoolOptions,
    PoolClosed,
    PoolOptions,
    PoolTimeout,
    UnknownClient,
)
from orbitive.clients.psycopg import AsyncConnectionPool, ConnectionPool
from orbitive.clients.sqlalchemy import FleetPool

from .._odd import SURROGATES, call, odd, texts
from ._workers import echo, echo_connect
from .test_remote import EchoServer, echo_server

__all__ = ["echo_server"]

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FIELDS = (
    "max_live", "min_idle", "max_idle", "max_waiting", "acquire_timeout", "idle_timeout",
    "max_lifetime", "handoff_after", "handoff_uses",
)  # fmt: skip
NAMED = (InvalidPoolOptions,)
#: kwargs names: hashable, odd and ordinary (client-side ones among them).
names = st.one_of(
    st.text(max_size=8),
    st.sampled_from([*SURROGATES, "", "a\x00b", "row_factory", "application_name", 1, None, b"k"]),
)


@SETTINGS
@given(field=st.sampled_from(FIELDS), value=odd)
def test_pool_options_refuse_odd_values_with_invalid_pool_options(
    field: str, value: object
) -> None:
    call(PoolOptions, **{field: value}, allowed=NAMED)


def _drop(pool: object) -> None:
    if isinstance(pool, ClientPool | ConnectionPool):
        pool.close()


@SETTINGS
@given(key=odd, create=st.one_of(st.just(object), odd), options=st.one_of(st.none(), odd))
def test_client_pool_refuses_odd_keys_callables_and_options(
    fleet: Fleet, key: object, create: object, options: object
) -> None:
    pool, _ = call(ClientPool, fleet, key, create, lambda c: None, options=options, allowed=NAMED)
    _drop(pool)


@SETTINGS
@given(
    conninfo=st.one_of(st.just("postgresql://app@db.example/main"), texts, odd),
    kwargs=st.one_of(
        st.none(),
        st.dictionaries(names, st.one_of(texts, odd), max_size=2),
        odd,
    ),
)
def test_the_psycopg_pools_refuse_odd_conninfo_and_kwargs(
    fleet: Fleet, conninfo: object, kwargs: object
) -> None:
    pool, _ = call(ConnectionPool, conninfo, fleet=fleet, kwargs=kwargs, allowed=NAMED)
    _drop(pool)
    pool, _ = call(AsyncConnectionPool, conninfo, fleet=fleet, kwargs=kwargs, allowed=NAMED)
    if isinstance(pool, AsyncConnectionPool):
        asyncio.run(pool.close())


@SETTINGS
@given(key=odd, fleet_value=st.one_of(st.none(), odd))
def test_fleet_pool_refuses_odd_keys_and_fleets(
    fleet: Fleet, key: object, fleet_value: object
) -> None:
    call(FleetPool, lambda: None, fleet=fleet, fleet_key=key, allowed=NAMED)
    call(FleetPool, lambda: None, fleet=fleet_value, fleet_key="k", allowed=NAMED)


@pytest.fixture
def remote(fleet: Fleet, echo_server: EchoServer) -> Iterator[ClientPool[socket.socket]]:
    """A remote-mode pool on a TCP echo server, with one idle client."""
    port = echo_server.server_address[1]
    with ClientPool(
        fleet, "echo", create=lambda: echo_connect(port), close=socket.socket.close,
        handler=echo, options=PoolOptions(max_live=1),
    ) as pool:  # fmt: skip
        assert pool.request(b"warm") == b"warm"
        yield pool


@SETTINGS
@given(payload=odd, timeout=st.one_of(st.none(), st.just(5.0), odd))
def test_requests_and_checkouts_refuse_odd_payloads_and_timeouts(
    remote: ClientPool[socket.socket], payload: object, timeout: Any
) -> None:
    allowed = (InvalidPoolOptions, PoolTimeout, PoolClosed)
    reply, _ = call(remote.request, payload, timeout=timeout, allowed=allowed)
    if reply is not None:
        assert reply == bytes(memoryview(payload))  # type: ignore[arg-type]  # bytes-like
    coroutine = remote.request_async(payload, timeout=timeout)  # type: ignore[arg-type]  # odd
    call(asyncio.run, coroutine, allowed=allowed)
    client, _ = call(remote.getconn, timeout, allowed=allowed)
    if client is not None:
        remote.putconn(cast(socket.socket, client))
    call(remote.putconn, payload, allowed=(UnknownClient,))
