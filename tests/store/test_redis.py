"""Redis engine specifics: server clock, URL forms, key prefix, foreign keys, missing driver.

Also the ``?timeout=`` parameter that the PostgreSQL and Redis URLs share.
"""

from __future__ import annotations

import sys

import pytest
import redis

from orbitive._core._errors import InvalidStoreUrl
from orbitive.store import ErrorKind, StoreError, _url, open_store
from orbitive.store._network import TIMEOUT_DEFAULT_S, split_timeout

from .._servers import TempRedis

LONG = 60.0


def raw_client(server: TempRedis) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True)


def test_expiry_is_on_the_servers_clock(redis_server: TempRedis, redis_url: str) -> None:
    with open_store(redis_url) as store, raw_client(redis_server) as client:
        lock = store.try_lock("clock", "w1", 100.0)
        seconds, micros = client.time()
        assert lock is not None
        assert abs(lock.expires_at - (seconds + micros / 1e6 + 100.0)) < 1.0


def test_a_lease_is_one_expiring_key_under_the_prefix(
    redis_server: TempRedis, redis_url: str
) -> None:
    prefix = redis_url.rpartition("prefix=")[2]
    with open_store(redis_url) as store, raw_client(redis_server) as client:
        lock = store.try_lock("jobs/nightly", "w1", 30.0)
        assert lock is not None
        token, _, owner = str(client.get(f"{prefix}lock:jobs/nightly")).split(" ", 2)
        assert (int(token), owner) == (lock.fencing_token, "w1")
        assert 0 < client.pttl(f"{prefix}lock:jobs/nightly") <= 30_000
        assert int(str(client.get(f"{prefix}fence"))) == lock.fencing_token


def test_prefixes_keep_stores_apart(redis_server: TempRedis) -> None:
    glob_prefix = "t*[x]?:"  # SCAN's glob characters, escaped by the engine
    with (
        open_store(f"{redis_server.url}?prefix=t*[x]?:") as first,
        open_store(f"{redis_server.url}?prefix=tz:") as second,
    ):
        mine = first.try_lock("shared", "w1", LONG)
        theirs = second.try_lock("shared", "w2", LONG)
        assert mine is not None and theirs is not None
        assert [info.owner for info in first.locks()] == ["w1"]
        assert [info.owner for info in second.locks()] == ["w2"]
        assert mine.release() and theirs.release()
    with raw_client(redis_server) as client:
        client.delete(f"{glob_prefix}fence", "tz:fence")


def test_a_foreign_value_under_the_prefix_is_a_database_error_not_a_lease(
    redis_server: TempRedis, redis_url: str
) -> None:
    prefix = redis_url.rpartition("prefix=")[2]
    with open_store(redis_url) as store, raw_client(redis_server) as client:
        client.set(f"{prefix}lock:alien", "not a lease")
        client.hset(f"{prefix}lock:hash", "field", "value")
        with pytest.raises(StoreError) as caught:
            store.try_lock("alien", "w1", LONG)
        assert caught.value.kind is ErrorKind.DATABASE
        assert isinstance(caught.value.__cause__, redis.ResponseError)
        assert store.inspect("alien") is None
        lock = store.try_lock("real", "w1", LONG)
        assert lock is not None
        assert [info.name for info in store.locks()] == ["real"]


def test_a_unix_socket_url_reaches_the_same_server(redis_server: TempRedis, redis_url: str) -> None:
    prefix = redis_url.rpartition("prefix=")[2]
    with (
        open_store(f"{redis_server.unix_url}?prefix={prefix}") as local,
        open_store(redis_url) as tcp,
    ):
        lock = local.try_lock("unix", "w1", LONG)
        assert lock is not None
        assert tcp.try_lock("unix", "w2", LONG) is None
        assert local.url == f"{redis_server.unix_url}?prefix={prefix}"


def test_server_down_is_unavailable(redis_server: TempRedis) -> None:
    server = TempRedis.start()  # a server of its own, to stop
    try:
        store = open_store(f"{server.url}?timeout=2")
        lock = store.try_lock("down", "w1", LONG)
        assert lock is not None
    finally:
        server.stop()
    with pytest.raises(StoreError) as caught:
        lock.renew(LONG)
    assert caught.value.kind is ErrorKind.UNAVAILABLE
    assert isinstance(caught.value.__cause__, redis.ConnectionError)
    store.close()


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:1/0?timeout=1", "rediss://127.0.0.1:1/0?timeout=1"]
)
def test_unreachable_server_is_unavailable(url: str) -> None:
    with pytest.raises(StoreError) as caught:
        open_store(url)
    assert caught.value.kind is ErrorKind.UNAVAILABLE


def test_missing_redis_py_is_a_clear_store_error(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(StoreError) as caught:
        open_store(redis_url)
    assert caught.value.kind is ErrorKind.UNAVAILABLE
    assert "orbitive[redis]" in str(caught.value)
    assert isinstance(caught.value.__cause__, ImportError)


# -- URL forms -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "redis://",
        "redis:///0",
        "rediss://?db=1",
        "unix://",
        "redis://h?prefix=",
        "redis://h?prefix=a%0Ab",
        "redis://h?prefix=a&prefix=b",
        "redis://h:port/0",
        "redis://h?timeout=0",
        "redis://h?timeout=-1",
        "redis://h?timeout=soon",
        "redis://h?timeout=nan",
        "redis://h?timeout=1e9",
        "redis://h?timeout=1&timeout=2",
        "postgresql://u@h/db?timeout=0",
        "postgres://u@h/db?timeout=x",
    ],
)
def test_bad_network_urls_are_refused(url: str) -> None:
    with pytest.raises(InvalidStoreUrl) as caught:
        open_store(url)
    assert caught.value.kind is ErrorKind.INVALID_INPUT


def test_the_timeout_parameter_is_split_off_and_the_rest_kept_byte_for_byte() -> None:
    url = "postgresql://u@h/db?options=-csearch_path%3Dx&timeout=2.5&sslmode=disable#f"
    assert split_timeout(url) == (
        "postgresql://u@h/db?options=-csearch_path%3Dx&sslmode=disable#f",
        2.5,
    )
    assert split_timeout("redis://h/0?timeout=1") == ("redis://h/0", 1.0)
    assert split_timeout("redis://h/0") == ("redis://h/0", TIMEOUT_DEFAULT_S)


def test_redis_passwords_are_redacted() -> None:
    assert _url._redacted("redis://u:secret@h:6379/0") == "redis://u:***@h:6379/0"
    assert _url._redacted("rediss://:secret@h/1") == "rediss://:***@h/1"


def test_a_server_that_forgot_the_scripts_gets_them_again(
    redis_server: TempRedis, redis_url: str
) -> None:
    with open_store(redis_url) as store, raw_client(redis_server) as client:
        client.script_flush()
        lock = store.try_lock("flushed", "w1", LONG)
        assert lock is not None
        client.script_flush()
        assert lock.renew(LONG)
        client.script_flush()
        assert lock.release()


def test_a_rediss_url_speaks_tls_to_the_same_server(redis_server: TempRedis) -> None:
    server = TempRedis.start(tls=True)  # a server of its own, with a TLS port
    try:
        assert server.tls_url is not None
        with (
            open_store(f"{server.tls_url}?ssl_cert_reqs=none&prefix=tls:") as tls,
            open_store(f"{server.url}?prefix=tls:") as plain,
        ):
            lock = tls.try_lock("secure", "w1", LONG)
            assert lock is not None
            info = plain.inspect("secure")
            assert info is not None and info.fencing_token == lock.fencing_token
            assert lock.release()
    finally:
        server.stop()


def test_locks_lists_every_lease_once_across_scan_batches(redis_url: str) -> None:
    names = [f"many/{index:04d}" for index in range(1300)]  # more than two SCAN batches
    with open_store(redis_url) as store:
        held = [store.try_lock(name, "w1", LONG) for name in names]
        assert all(lock is not None for lock in held)
        assert [info.name for info in store.locks()] == names


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:secret@h/db?timeout=soon",
        "redis://u:secret@h/0?timeout=1&timeout=2",
        "redis://:secret@h/0?prefix=",
        "rediss://:secret@:6379/0",
    ],
)
def test_refusals_never_show_the_password(url: str) -> None:
    with pytest.raises(InvalidStoreUrl) as caught:
        open_store(url)
    assert "secret" not in str(caught.value)


def test_a_prefix_with_no_utf8_form_is_refused_at_open(redis_server: TempRedis) -> None:
    """Not a UnicodeEncodeError on every later call."""
    for prefix in ("\ud800", "a%ed%a0%80b"):
        with pytest.raises(InvalidStoreUrl, match="prefix"):
            open_store(f"{redis_server.url}?prefix={prefix}")
