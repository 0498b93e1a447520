"""The store's log records (``orbitive.store``, issue 24 item 2): a lock lost and why,
a force-release, a store that went unavailable with its cause and that came back.

Real parts: a SQLite file two stores share, an ``orbit force-release`` in another
process, a redis-server stopped and started again on its port.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbitive.store import ErrorKind, Lock, StoreError, open_store

from .._servers import ServerUnavailable, TempRedis, free_port

Records = list[tuple[str, int, str]]


def _messages(caplog: pytest.LogCaptureFixture) -> Records:
    return [(r.name, r.levelno, r.getMessage()) for r in caplog.records]


def test_a_lock_force_released_by_another_process_is_logged_as_lost_by_its_holder(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orbitive")
    url = f"sqlite://{tmp_path / 'locks.db'}"
    lost = threading.Event()
    with (
        open_store(url) as store,
        store.lock("jobs/nightly", "w1", ttl=0.9, on_lost=lambda _: lost.set()) as lock,
    ):
        done = subprocess.run(
            [sys.executable, "-m", "orbitive", "force-release", "--store", url, "jobs/nightly"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (done.returncode, done.stdout) == (0, "released\n"), done.stderr
        assert lost.wait(10.0)  # the next renew, a third of the TTL later
        token = lock.fencing_token
    assert _messages(caplog) == [
        (
            "orbitive.store",
            logging.WARNING,
            f"store {url}: lock 'jobs/nightly' (owner 'w1', fencing token {token}) is lost: "
            "the store no longer had it while its TTL had time left: it was force-released, "
            "or the store's clock ran ahead",
        )
    ]


def test_a_force_release_is_logged_where_it_is_made(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orbitive")
    url = f"sqlite://{tmp_path / 'locks.db'}"
    with open_store(url) as store:
        assert store.try_lock("jobs/nightly", "w1", 30.0) is not None
        assert store.force_release("jobs/nightly")
        assert not store.force_release("jobs/nightly")  # nothing live: nothing to say
    assert _messages(caplog) == [
        (
            "orbitive.store",
            logging.WARNING,
            f"store {url}: lock 'jobs/nightly' force-released; its holder has lost it",
        )
    ]


def test_a_lease_past_its_ttl_is_logged_lost_once_at_its_renew_or_its_release(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orbitive")
    url = f"sqlite://{tmp_path / 'locks.db'}"
    with open_store(url) as store:
        renewed, released = store.try_lock("a", "w1", 0.1), store.try_lock("b", "w1", 0.1)
        assert isinstance(renewed, Lock) and isinstance(released, Lock)
        time.sleep(0.2)
        assert not renewed.renew(30.0)
        assert not renewed.release()  # known lost already: no second record
        assert not released.release()

    def lost(name: str, lock: Lock, verb: str) -> tuple[str, int, str]:
        return (
            "orbitive.store",
            logging.WARNING,
            f"store {url}: lock {name!r} (owner 'w1', fencing token {lock.fencing_token}) "
            f"is lost: its TTL ran out before it was {verb}",
        )

    assert _messages(caplog) == [lost("a", renewed, "renewed"), lost("b", released, "released")]


@pytest.fixture
def own_redis(redis_server: TempRedis) -> Iterator[TempRedis]:
    """A server of this test's own, to stop and start (``redis_server``: skip without one)."""
    del redis_server
    try:
        server = TempRedis.start()
    except ServerUnavailable as error:
        pytest.fail(f"Redis unavailable: {error}")
    try:
        yield server
    finally:
        server.stop()


def test_a_store_that_goes_away_and_comes_back_is_logged_once_each_way(
    own_redis: TempRedis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orbitive")
    failures = []
    with open_store(f"{own_redis.url}?timeout=1") as store:
        assert store.locks() == []
        own_redis.halt()
        for _ in range(3):
            with pytest.raises(StoreError) as caught:
                store.locks()
            assert caught.value.kind is ErrorKind.UNAVAILABLE
            failures.append(str(caught.value))
        own_redis.restart()
        assert store.locks() == []
        assert store.locks() == []  # and nothing more while it answers
    down, back = _messages(caplog)
    assert failures[0].startswith("redis store unavailable: ")
    assert down == (
        "orbitive.store",
        logging.WARNING,
        f"{failures[0]}; its calls fail until it answers again",
    )
    assert back[:2] == ("orbitive.store", logging.INFO)
    assert re.fullmatch(r"redis store answers again, after \d+\.\d s", back[2]), back[2]


def test_a_postgres_store_out_of_reach_at_open_is_logged_with_its_cause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pytest.importorskip("psycopg")
    caplog.set_level(logging.INFO, logger="orbitive")
    with pytest.raises(StoreError) as caught:
        open_store(f"postgresql://u@127.0.0.1:{free_port()}/db?timeout=1")
    assert caught.value.kind is ErrorKind.UNAVAILABLE
    assert _messages(caplog) == [
        (
            "orbitive.store",
            logging.WARNING,
            f"{caught.value}; its calls fail until it answers again",
        )
    ]


def test_a_semaphore_lease_past_its_ttl_is_logged_lost_with_its_slot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="orbitive")
    url = f"sqlite://{tmp_path / 'locks.db'}"
    with open_store(url) as store:
        sem = store.semaphore("payments-api", 2)
        first, second = sem.try_acquire("w1", 30.0), sem.try_acquire("w1", 0.1)
        assert first is not None and second is not None
        time.sleep(0.2)
        assert not second.release()
        assert first.release()
    assert _messages(caplog) == [
        (
            "orbitive.store",
            logging.WARNING,
            f"store {url}: semaphore 'payments-api' slot 1 (owner 'w1', fencing token "
            f"{second.fencing_token}) is lost: its TTL ran out before it was released",
        )
    ]
