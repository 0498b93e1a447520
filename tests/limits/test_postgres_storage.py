"""The ``postgresql://`` storage, sync and asyncio, against ``memory://``'s semantics;
registration, reclamation of expired rows, bad input and a server that is down."""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

import limits.errors
import psycopg
import pytest
from limits import RateLimitItemPerSecond
from limits.aio.strategies import STRATEGIES as AIO_STRATEGIES
from limits.storage import MemoryStorage, storage_from_string
from limits.strategies import STRATEGIES

from orbitive.limits import (
    AsyncPostgresStorage,
    InvalidRateStorageUrl,
    PostgresStorage,
    _postgres_storage,
    _postgres_storage_async,
)
from orbitive.store import ErrorKind, StoreError

from ._pg import form, open_form, pg_url, storage

__all__ = ["form", "pg_url", "storage"]  # fixtures

#: A server nobody listens on, with a short call bound.
DOWN = "postgresql://postgres@127.0.0.1:1/postgres?timeout=1"
#: A window so long that no test crosses a boundary of the sliding window's windows.
LONG = 1_000_000


@pytest.fixture
def memory() -> Iterator[MemoryStorage]:
    """The ``memory://`` storage, the reference semantics."""
    yield MemoryStorage()


def test_importing_orbitive_limits_registers_every_postgres_scheme() -> None:
    for scheme, kind in (
        ("postgresql", PostgresStorage),
        ("postgres", PostgresStorage),
        ("async+postgresql", AsyncPostgresStorage),
        ("async+postgres", AsyncPostgresStorage),
    ):
        made = storage_from_string(f"{scheme}://app@db.invalid/main")  # connects on first use
        assert type(made) is kind
        assert repr(made).endswith(f"{scheme}://app@db.invalid/main>")
        made.close()


def test_the_fixed_window_counts_as_memory_does(storage: Any, memory: MemoryStorage) -> None:
    for target in (storage, memory):
        assert [target.incr("a", 60) for _ in range(3)] == [1, 2, 3]
        assert target.incr("a", 60, amount=5) == 8
        assert (target.get("a"), target.get("none")) == (8, 0)
        assert target.get_expiry("a") == pytest.approx(time.time() + 60, abs=1.0)
        assert target.get_expiry("none") == pytest.approx(time.time(), abs=1.0)
        target.clear("a")
        assert target.get("a") == 0
        assert target.incr("a", 60) == 1


def test_a_fixed_window_ends_after_its_expiry_and_the_next_starts_anew(storage: Any) -> None:
    assert storage.incr("short", 0.3, amount=4) == 4
    first_end = storage.get_expiry("short")
    time.sleep(0.45)
    assert storage.get("short") == 0
    assert storage.incr("short", 0.3) == 1  # the expired row overwritten in place
    assert storage.get_expiry("short") > first_end


def test_the_moving_window_admits_as_memory_does(storage: Any, memory: MemoryStorage) -> None:
    amounts = [1, 2, 1, 1, 3, 1, 6]
    answers = [
        [target.acquire_entry("m", 5, 60, amount=amount) for amount in amounts]
        for target in (storage, memory)
    ]
    assert answers[0] == answers[1] == [True, True, True, True, False, False, False]
    (start, count), (memory_start, memory_count) = (
        target.get_moving_window("m", 5, 60) for target in (storage, memory)
    )
    assert count == memory_count == 5
    assert start == pytest.approx(memory_start, abs=1.0)
    now = time.time()
    assert storage.get_moving_window("none", 5, 60) == (pytest.approx(now, abs=1.0), 0)
    assert not storage.acquire_entry("zero", 0, 60)


def test_hits_leave_the_moving_window_after_its_expiry(storage: Any) -> None:
    started = time.monotonic()
    assert [storage.acquire_entry("slide", 2, 1.0) for _ in range(3)] == [True, True, False]
    time.sleep(0.3)
    if time.monotonic() - started < 0.9:  # (a stall of the test process skips this check)
        assert not storage.acquire_entry("slide", 2, 1.0)  # both hits still in the last 1 s
    time.sleep(max(1.2 - (time.monotonic() - started), 0.0))
    assert storage.acquire_entry("slide", 2, 1.0)  # both left: the refusal counted nothing
    assert storage.get_moving_window("slide", 2, 1.0)[1] == 1
    storage.clear("slide")
    assert storage.get_moving_window("slide", 2, 1.0)[1] == 0


def test_the_sliding_window_counts_as_memory_does(storage: Any, memory: MemoryStorage) -> None:
    amounts = [1, 2, 1, 3, 1, 1]
    answers = [
        [target.acquire_sliding_window_entry("s", 5, LONG, amount=amount) for amount in amounts]
        for target in (storage, memory)
    ]
    assert answers[0] == answers[1] == [True, True, True, False, True, False]
    (prev, prev_ttl, cur, cur_ttl), memory_window = (
        target.get_sliding_window("s", LONG) for target in (storage, memory)
    )
    assert (prev, prev_ttl, cur) == memory_window[:3] == (0, 0.0, 5)
    assert cur_ttl == pytest.approx(memory_window[3], abs=1.0)
    assert cur_ttl == pytest.approx(LONG - time.time() % LONG + LONG, abs=1.0)
    for target in (storage, memory):
        target.clear_sliding_window("s", LONG)
        assert target.get_sliding_window("s", LONG)[:3] == (0, 0.0, 0)


def test_the_previous_window_weighs_by_the_share_of_it_still_in_the_sliding_window(
    storage: Any,
) -> None:
    expiry = 1.0
    time.sleep(expiry - time.time() % expiry + 0.05)  # early in a window
    assert all(storage.acquire_sliding_window_entry("w", 4, expiry) for _ in range(4))
    time.sleep(expiry - time.time() % expiry + 0.5)  # half-way through the next window
    prev, prev_ttl, cur, cur_ttl = storage.get_sliding_window("w", expiry)
    assert (prev, cur) == (4, 0)
    assert 0.0 < prev_ttl <= 0.5 and cur_ttl == pytest.approx(prev_ttl + expiry, abs=1e-6)
    admitted = 0
    while storage.acquire_sliding_window_entry("w", 4, expiry):
        admitted += 1
    # A hit is admitted while floor(4 * share + current) + 1 <= 4, where share (prev_ttl /
    # expiry when read) only shrinks: one more when it crossed a quarter meanwhile.
    fewest = 4 - math.floor(4 * prev_ttl / expiry)
    assert admitted in (fewest, fewest + 1)


@pytest.mark.parametrize("strategy", ["fixed-window", "moving-window", "sliding-window-counter"])
def test_each_strategy_of_limits_admits_as_it_does_on_memory(
    form: str, storage: Any, memory: MemoryStorage, strategy: str
) -> None:
    item = RateLimitItemPerSecond(5, LONG)
    if form == "sync":
        limiter = STRATEGIES[strategy](storage)
        hit: Callable[..., bool] = limiter.hit
        test: Callable[..., bool] = limiter.test
    else:
        aio_limiter = AIO_STRATEGIES[strategy](storage.storage)  # type: ignore[abstract]  # each is concrete
        hit = lambda *args, **kwargs: storage.run(aio_limiter.hit(*args, **kwargs))  # noqa: E731
        test = lambda *args, **kwargs: storage.run(aio_limiter.test(*args, **kwargs))  # noqa: E731
    reference = STRATEGIES[strategy](memory)
    for limiter_hit, limiter_test in ((hit, test), (reference.hit, reference.test)):
        hits = [limiter_hit(item, "user") for _ in range(2)]
        hits.append(limiter_test(item, "user", cost=3))
        hits.append(limiter_hit(item, "user", cost=3))
        hits.append(limiter_test(item, "user"))
        hits.append(limiter_hit(item, "user"))
        hits.append(limiter_hit(item, "other", cost=6))
        assert hits == [True, True, True, True, False, False, False], strategy


def test_the_sync_and_the_asyncio_forms_share_the_tables(pg_url: str) -> None:
    sync = open_form("sync", pg_url)
    other = open_form("async", pg_url)
    try:
        assert sync.incr("shared", 60, amount=3) == 3
        assert other.incr("shared", 60) == 4
        assert other.acquire_entry("shared-m", 2, 60)
        assert sync.get_moving_window("shared-m", 2, 60)[1] == 1
        assert sync.acquire_sliding_window_entry("shared-s", 2, LONG)
        assert other.get_sliding_window("shared-s", LONG)[2] == 1
    finally:
        sync.close()
        other.close()


def test_reset_forgets_every_key_and_counts_the_live_ones(storage: Any) -> None:
    for key in ("a", "b", "c"):
        storage.incr(key, 60)
    storage.incr("gone", 0.05)
    storage.acquire_entry("m", 5, 60)
    storage.acquire_sliding_window_entry("s", 5, LONG)
    time.sleep(0.1)
    assert storage.reset() == 5
    assert storage.get("a") == 0 and storage.get_moving_window("m", 5, 60)[1] == 0
    assert storage.reset() == 0
    assert storage.check()


def test_expired_rows_are_swept_by_a_write_once_a_minute(
    storage: Any, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in range(5):
        storage.incr(f"c{key}", 0.1)
        storage.acquire_entry(f"m{key}", 3, 0.1)
    storage.acquire_sliding_window_entry("s", 3, 0.1)
    time.sleep(0.35)  # the sliding row lives two windows
    monkeypatch.setattr(_postgres_storage, "SWEEP_EVERY_S", 0.0)
    monkeypatch.setattr(_postgres_storage_async, "SWEEP_EVERY_S", 0.0)
    assert storage.incr("live", 60) == 1  # and the sweep after it
    with psycopg.connect(pg_url) as conn:
        counted = [
            conn.execute(f"SELECT count(*) FROM orbitive_limits_{table}").fetchone()
            for table in ("counters", "moving", "sliding")
        ]
    assert counted == [(1,), (0,), (0,)]


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "options", "says"),
    [
        (None, {}, "must be a str"),
        (b"postgresql://h/db", {}, "must be a str"),
        ("mysql://h/db", {}, "postgresql://, "),
        ("postgresql:h", {}, "expected one of"),
        ("postgresql://h/db?bogus=1", {}, 'invalid URI query parameter: "bogus"'),
        ("postgresql://h/db?timeout=0", {}, "timeout must be seconds in 0.05..3600"),
        ("postgresql://h/db?timeout=1&timeout=2", {}, "timeout is given 2 times"),
        ("postgresql://h/d\x00b", {}, "NUL"),
        ("postgresql://[zz/db", {}, "malformed"),
        ("postgresql://h/db", {"pool_size": 5}, "takes no option (pool_size): put connection"),
    ],
)
def test_a_bad_url_or_an_option_is_refused_with_what_to_change(
    uri: object, options: dict[str, Any], says: str
) -> None:
    makers: list[Callable[..., object]] = [
        PostgresStorage,
        lambda u, **o: AsyncPostgresStorage(_async(u), **o),
    ]
    for make in makers:
        with pytest.raises(InvalidRateStorageUrl) as raised:
            make(uri, **options)
        assert says in str(raised.value)
        assert isinstance(raised.value, ValueError)


def _async(uri: Any) -> Any:
    return "async+" + uri if isinstance(uri, str) and uri.startswith("postgres") else uri


def test_each_form_refuses_the_others_scheme_and_no_message_shows_the_password() -> None:
    with pytest.raises(InvalidRateStorageUrl, match="expected one of async"):
        AsyncPostgresStorage("postgresql://h/db")
    with pytest.raises(InvalidRateStorageUrl, match="expected one of postgresql"):
        PostgresStorage("async+postgresql://h/db")
    with pytest.raises(InvalidRateStorageUrl) as raised:
        PostgresStorage("postgresql://app:s3cret@h/db?bogus=1")
    assert "s3cret" not in str(raised.value) and "***" in str(raised.value)
    assert "s3cret" not in repr(PostgresStorage("postgresql://app:s3cret@h/db"))


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda s: s.incr(7, 60), TypeError),
        (lambda s: s.incr("a\x00b", 60), ValueError),
        (lambda s: s.incr("\ud800", 60), ValueError),
        (lambda s: s.incr("k" * 2049, 60), ValueError),
        (lambda s: s.incr("k", 0), ValueError),
        (lambda s: s.incr("k", math.nan), ValueError),
        (lambda s: s.incr("k", math.inf), ValueError),
        (lambda s: s.incr("k", 1e9 + 1), ValueError),
        (lambda s: s.incr("k", "60"), TypeError),
        (lambda s: s.incr("k", True), TypeError),
        (lambda s: s.incr("k", 60, amount=0), ValueError),
        (lambda s: s.incr("k", 60, amount=1.5), TypeError),
        (lambda s: s.acquire_entry("k", -1, 60), ValueError),
        (lambda s: s.acquire_entry("k", 5, 60, amount=2**63), ValueError),
        (lambda s: s.acquire_sliding_window_entry("k", 5, -1), ValueError),
        (lambda s: s.get_moving_window(None, 5, 60), TypeError),
        (lambda s: s.get_sliding_window("k", 0), ValueError),
        (lambda s: s.clear_sliding_window("k", None), TypeError),
        (lambda s: s.get(b"k"), TypeError),
    ],
)
def test_a_bad_argument_is_refused_before_any_round_trip(
    form: str, call: Callable[[Any], object], error: type[Exception]
) -> None:
    down = open_form(form, DOWN)  # any round trip would raise StoreError
    try:
        with pytest.raises(error):
            call(down)
    finally:
        down.close()


def test_more_hits_than_the_limit_are_refused_without_a_round_trip(form: str) -> None:
    down = open_form(form, DOWN)
    try:
        assert down.acquire_entry("k", 3, 60, amount=4) is False
        assert down.acquire_sliding_window_entry("k", 3, 60, amount=4) is False
    finally:
        down.close()


CALLS: list[Callable[[Any], object]] = [
    lambda s: s.incr("k", 60),
    lambda s: s.get("k"),
    lambda s: s.get_expiry("k"),
    lambda s: s.clear("k"),
    lambda s: s.reset(),
    lambda s: s.acquire_entry("k", 5, 60),
    lambda s: s.get_moving_window("k", 5, 60),
    lambda s: s.acquire_sliding_window_entry("k", 5, 60),
    lambda s: s.get_sliding_window("k", 60),
    lambda s: s.clear_sliding_window("k", 60),
]


@pytest.mark.parametrize("call", CALLS)
def test_a_server_that_is_down_raises_unavailable_within_the_timeout(
    form: str, call: Callable[[Any], object]
) -> None:
    down = open_form(form, DOWN)
    try:
        started = time.monotonic()
        with pytest.raises(StoreError) as raised:
            call(down)
        assert raised.value.kind is ErrorKind.UNAVAILABLE
        assert time.monotonic() - started < 1.0 + 2.0 + 1.0  # timeout + libpq's 2 s + slack
        assert down.check() is False
    finally:
        down.close()


@pytest.mark.parametrize("call", CALLS[:3])
def test_wrap_exceptions_raises_limits_storage_error_around_the_store_error(
    form: str, call: Callable[[Any], object]
) -> None:
    down = open_form(form, DOWN, wrap_exceptions=True)
    try:
        with pytest.raises(limits.errors.StorageError) as raised:
            call(down)
        assert isinstance(raised.value.__cause__, StoreError)
    finally:
        down.close()


def test_every_storage_object_makes_the_tables_and_finds_those_made_before(pg_url: str) -> None:
    opened = [open_form(kind, pg_url) for kind in ("sync", "async", "sync", "async")]
    try:
        assert [target.incr("first", 60) for target in opened] == [1, 2, 3, 4]
    finally:
        for target in opened:
            target.close()


def test_a_connection_the_server_ended_is_replaced_and_the_call_answers(storage: Any) -> None:
    assert storage.incr("k", 60) == 1
    ended = 0
    with psycopg.connect(storage_url(storage), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE pid <> pg_backend_pid() AND datname = current_database() "
            "AND backend_type = 'client backend'"
        ).fetchall()
        ended = len(rows)
    assert ended >= 1
    assert storage.incr("k", 60) == 2  # retried once on a fresh connection
    assert storage.acquire_entry("m", 1, 60)
    assert storage.get_sliding_window("s", LONG)[2] == 0


def storage_url(storage: Any) -> str:
    """The libpq URL a storage (or its adapter) connects to."""
    found: str = getattr(storage, "storage", storage)._url
    return found


def test_a_user_who_may_not_create_uses_the_tables_their_owner_made(form: str, pg_url: str) -> None:
    owner = open_form(form, pg_url)
    assert owner.check()  # the tables and functions made, as their owner
    owner.close()
    role = f"limited_{secrets.token_hex(4)}"
    schema = pg_url.rsplit("%3D", 1)[1]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        conn.execute(
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}"
        )
    try:
        user = open_form(form, pg_url.replace("postgres@", f"{role}@", 1))
        try:
            assert user.incr("k", 60) == 1
            assert user.acquire_entry("m", 2, 60)
            assert user.acquire_sliding_window_entry("s", 2, LONG)
            assert user.reset() == 3
        finally:
            user.close()
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}")
            conn.execute(f"DROP ROLE {role}")
