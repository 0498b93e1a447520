"""The blocking helper ``store.lock()``: waiting, timeouts, auto-renew, loss (issue 3 item 6)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from orbitive._core._errors import InvalidTtl, LockTimeout
from orbitive.store import Lock, Store, StoreError, open_store


def release_later(lock: Lock, delay: float) -> threading.Thread:
    def run() -> None:
        time.sleep(delay)
        lock.release()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_lock_waits_for_a_release(store: Store, other: Store) -> None:
    holder = other.try_lock("wait", "holder", 60.0)
    assert holder is not None
    thread = release_later(holder, 0.3)
    start = time.monotonic()
    with store.lock("wait", ttl=10.0, timeout=20.0) as lock:
        waited = time.monotonic() - start
        assert lock.fencing_token > holder.fencing_token
    thread.join()
    assert 0.2 < waited < 10.0
    assert store.inspect("wait") is None


def test_lock_waits_for_the_holders_expiry(store: Store, other: Store) -> None:
    holder = other.try_lock("expire", "holder", 0.4)
    assert holder is not None
    with store.lock("expire", ttl=10.0, timeout=20.0) as lock:
        assert holder.remaining() == 0.0
        assert lock.fencing_token > holder.fencing_token


def test_timeout_zero_is_exactly_one_attempt(store: Store, other: Store) -> None:
    assert other.try_lock("once", "holder", 60.0) is not None
    before = store.statistics().busy_count
    with pytest.raises(LockTimeout) as caught:
        store.lock("once", timeout=0)
    assert store.statistics().busy_count == before + 1
    assert "'holder'" in str(caught.value)
    assert isinstance(caught.value, TimeoutError)


def test_timeout_zero_on_a_free_name_succeeds(store: Store) -> None:
    with store.lock("free", timeout=0) as lock:
        assert not lock.lost


def test_timeout_raises_after_about_that_long(store: Store, other: Store) -> None:
    assert other.try_lock("busy", "holder", 60.0) is not None
    start = time.monotonic()
    with pytest.raises(LockTimeout):
        store.lock("busy", ttl=5.0, timeout=0.3)
    assert 0.25 < time.monotonic() - start < 5.0
    assert store.statistics().busy_count >= 2


@pytest.mark.parametrize("timeout", [-1.0, float("nan"), "1", True])
def test_bad_timeout_is_refused(store: Store, timeout: object) -> None:
    with pytest.raises(InvalidTtl):
        store.lock("t", timeout=timeout)  # type: ignore[arg-type]
    assert store.inspect("t") is None


def test_bad_ttl_is_the_duration_guard(store: Store) -> None:
    with pytest.raises(StoreError) as caught:
        store.lock("t", ttl=0.0, timeout=0)
    assert caught.value.kind.value == "database"
    assert isinstance(caught.value.__cause__, InvalidTtl)


def test_auto_renew_keeps_the_lock_past_its_ttl(store: Store, other: Store) -> None:
    # A TTL of 2 s renewed every 0.67 s: lost only if the renewing thread is kept
    # off the CPU for more than 1.3 s, which a loaded machine can do to a shorter one.
    ttl = 2.0
    with store.lock("renewed", ttl=ttl, timeout=0) as lock:
        held_past = time.monotonic() + 1.5 * ttl
        while time.monotonic() < held_past or store.statistics().renewed_count < 2:
            assert other.try_lock("renewed", "intruder", 60.0) is None
            time.sleep(0.05)
        assert not lock.lost
    assert store.inspect("renewed") is None
    assert lock.release() is False


def test_without_auto_renew_the_lease_lapses(store: Store, other: Store) -> None:
    with store.lock("plain", ttl=0.3, timeout=0, auto_renew=False) as lock:
        time.sleep(0.45)
        assert lock.lost
        assert other.try_lock("plain", "next", 60.0) is not None


def test_loss_sets_the_flag_calls_back_and_exit_does_not_raise(store: Store, other: Store) -> None:
    lost: list[Lock] = []
    called = threading.Event()

    def on_lost(lock: Lock) -> None:
        lost.append(lock)
        called.set()

    with store.lock("lose", ttl=1.5, timeout=0, on_lost=on_lost) as lock:
        assert other.force_release("lose")
        assert called.wait(30.0)  # at the next renewal, 0.5 s on; longer only under load
        assert lock.lost
        successor = other.try_lock("lose", "next", 60.0)
        assert successor is not None
    assert lost == [lock]
    assert other.inspect("lose") is not None  # the successor kept its lease
    assert store.statistics().lost_count == 1


def test_default_owner_is_fresh_and_names_this_process(store: Store) -> None:
    with store.lock("owner-a", timeout=0) as first, store.lock("owner-b", timeout=0) as second:
        assert first.owner != second.owner
        assert f":{os.getpid()}:" in first.owner


def test_explicit_owner_is_used(store: Store) -> None:
    with store.lock("owner-c", "worker-9", timeout=0) as lock:
        info = store.inspect("owner-c")
        assert info is not None and info.owner == "worker-9" == lock.owner


def test_closing_the_store_stops_renewal(store_url: str, other: Store) -> None:
    store = open_store(store_url)
    lock = store.lock("closing", ttl=0.3, timeout=0)
    store.close()
    time.sleep(0.5)
    assert lock.lost
    assert other.try_lock("closing", "next", 60.0) is not None


def test_threads_of_one_process_take_turns(store: Store) -> None:
    inside = [0]
    turns = [0]
    errors: list[BaseException] = []
    guard = threading.Lock()

    def worker() -> None:
        try:
            for _ in range(5):
                with store.lock("turns", ttl=10.0, timeout=30.0):
                    with guard:
                        inside[0] += 1
                        assert inside[0] == 1
                    time.sleep(0.005)
                    with guard:
                        inside[0] -= 1
                        turns[0] += 1
        except BaseException as error:  # reported to the main thread
            errors.append(error)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert turns[0] == 20


def test_without_auto_renew_a_failed_renew_calls_back(store: Store, other: Store) -> None:
    lost: list[Lock] = []
    with store.lock("manual", ttl=60.0, timeout=0, auto_renew=False, on_lost=lost.append) as lock:
        assert lock.renew(60.0)
        assert lost == []
        assert other.force_release("manual")
        assert lock.renew(60.0) is False
        assert lost == [lock]
        assert lock.renew(60.0) is False
    assert lost == [lock]
