"""The store contract (seed 002, issue 3 item 1), pinned once and run on every engine."""

from __future__ import annotations

import gc
import math
import os
import pickle
import threading
import time

import pytest

from orbitive import OrbitError
from orbitive._core._errors import InvalidLockName, InvalidLockOwner, InvalidTtl
from orbitive.store import ErrorKind, Lock, LockInfo, Store, StoreError, open_store

#: Long enough never to lapse during a test.
LONG = 60.0
#: Short enough to lapse quickly, long enough to act within.
SHORT = 0.5

BAD_TTLS = [0, 0.0, -1, -0.001, math.nan, math.inf, -math.inf, True, "5", None]
BAD_NAMES = [
    "",
    "x" * 256,
    "é" * 128,  # 256 UTF-8 bytes
    "a\x00b",
    "line\nbreak",
    "tab\there",
    "del\x7f",
    "c1\x85",
    "\ud800",
    None,
    42,
    b"bytes",
]
GOOD_NAMES = [
    "x" * 255,
    "é" * 127 + "x",  # 255 UTF-8 bytes
    "jobs/nightly",
    " spaced name ",
    "ünïcödé ✓ 🎉",
    "a",
    "A",
    "%_*?'\";--",
]
BAD_OWNERS = ["", "a\x00b", "o" * 256, None, 7, b"worker"]


def held(store: Store, name: str, owner: str = "w1", ttl: float = LONG) -> Lock:
    lock = store.try_lock(name, owner, ttl)
    assert lock is not None, f"{name!r} should have been free"
    return lock


def lapse(*locks: Lock) -> None:
    """Sleep until every lock's window has passed, with a margin."""
    time.sleep(max(lock.remaining() for lock in locks) + 0.1)


# -- exclusive grant -------------------------------------------------------------------------


def test_try_lock_grants_and_reports_the_tenure(store: Store) -> None:
    lock = held(store, "jobs/nightly", "worker-1", 30.0)
    assert (lock.name, lock.owner) == ("jobs/nightly", "worker-1")
    assert isinstance(lock.fencing_token, int) and lock.fencing_token > 0
    assert 29.0 < lock.remaining() <= 30.0
    assert not lock.lost


def test_the_local_window_allows_for_a_step_of_the_engines_clock(store: Store) -> None:
    """SHM's clock is this host's monotonic clock; the others' (``time.time()``, a
    server's) may step forward or run fast, so the window a holder believes in ends
    1 % of the ttl and 2 ms before ``started + ttl`` (Redlock's allowance). A wall
    clock stepped 1.4 ms forward once let a waiter in while the holder still believed."""
    allowance = 0.0 if store._backend.monotonic else 10.0 * 0.01 + 0.002
    lock = held(store, "clock-step", "w1", 10.0)
    assert 9.0 < lock.remaining() <= 10.0 - allowance
    assert lock.renew(10.0)
    assert 9.0 < lock.remaining() <= 10.0 - allowance


def test_second_try_lock_returns_none_while_held(store: Store, other: Store) -> None:
    lock = held(store, "jobs/a")
    assert other.try_lock("jobs/a", "w2", LONG) is None
    assert store.try_lock("jobs/a", "w1", LONG) is None  # same owner: still one live tenure
    assert other.try_lock("jobs/b", "w2", LONG) is not None  # only the name decides
    assert lock.renew(LONG)


def test_release_makes_the_name_free_again(store: Store, other: Store) -> None:
    lock = held(store, "n")
    assert lock.release() is True
    assert store.inspect("n") is None
    again = held(other, "n", "w2")
    assert again.fencing_token > lock.fencing_token


def test_fencing_tokens_strictly_increase_across_names(store: Store) -> None:
    tokens = []
    for index in range(6):
        lock = held(store, f"name-{index % 2}")
        tokens.append(lock.fencing_token)
        assert lock.release()
    assert tokens == sorted(set(tokens))


def test_expires_at_is_on_the_engine_clock(store: Store, store_url: str) -> None:
    clock = time.monotonic if store_url.startswith("shm:") else time.time
    lock = held(store, "clock", ttl=10.0)
    assert abs(lock.expires_at - (clock() + 10.0)) < 1.0


# -- duration guard --------------------------------------------------------------------------


@pytest.mark.parametrize("ttl", BAD_TTLS, ids=repr)
def test_try_lock_bad_ttl_is_a_database_error_and_grants_nothing(store: Store, ttl: object) -> None:
    with pytest.raises(StoreError) as caught:
        store.try_lock("guarded", "w1", ttl)  # type: ignore[arg-type]
    assert caught.value.kind is ErrorKind.DATABASE
    assert isinstance(caught.value.__cause__, InvalidTtl)
    assert str(caught.value.__cause__) in str(caught.value)
    assert store.inspect("guarded") is None


@pytest.mark.parametrize("ttl", BAD_TTLS, ids=repr)
def test_renew_bad_ttl_is_a_database_error_and_keeps_the_lease(store: Store, ttl: object) -> None:
    lock = held(store, "guarded")
    before = store.inspect("guarded")
    with pytest.raises(StoreError) as caught:
        lock.renew(ttl)  # type: ignore[arg-type]
    assert caught.value.kind is ErrorKind.DATABASE
    assert isinstance(caught.value.__cause__, InvalidTtl)
    after = store.inspect("guarded")
    assert before is not None and after is not None
    assert (after.fencing_token, after.expires_at) == (before.fencing_token, before.expires_at)
    assert lock.release()


def test_duration_guard_fires_before_the_engine_is_touched(store_url: str) -> None:
    store = open_store(store_url)
    store.close()
    with pytest.raises(StoreError) as caught:
        store.try_lock("n", "w1", -1.0)
    assert caught.value.kind is ErrorKind.DATABASE  # not CLOSED: the engine was never asked
    with pytest.raises(StoreError) as closed:
        store.try_lock("n", "w1", 1.0)
    assert closed.value.kind is ErrorKind.CLOSED


def test_a_sub_millisecond_ttl_counts_as_one_millisecond(store: Store) -> None:
    lock = held(store, "tiny", ttl=1e-9)
    assert lock.remaining() <= 0.001
    time.sleep(0.05)
    assert lock.renew(1e-7) is False
    assert held(store, "tiny").fencing_token > lock.fencing_token


def test_the_engines_own_guard_keeps_its_message_in_the_cause(store: Store) -> None:
    engine = store._backend.engine  # bypass the contract's guard on purpose
    with pytest.raises(StoreError) as caught:
        engine.acquire("raw", "w1", 0.0)
    assert caught.value.kind is ErrorKind.DATABASE
    assert caught.value.__cause__ is not None
    assert str(caught.value.__cause__) in str(caught.value)
    assert store.inspect("raw") is None


# -- renew -----------------------------------------------------------------------------------


def test_renew_sets_a_new_full_window_from_now_not_additive(store: Store) -> None:
    lock = held(store, "r", ttl=30.0)
    first_expiry = lock.expires_at
    assert lock.renew(2.0)
    info = store.inspect("r")
    assert info is not None and info.remaining_s <= 2.0
    assert lock.remaining() <= 2.0
    assert lock.expires_at < first_expiry  # additive would have given about 32 s
    assert lock.renew(40.0)
    assert 39.0 < lock.remaining() <= 40.0
    assert lock.fencing_token == info.fencing_token  # renew keeps the token


def test_renew_after_ttl_returns_false_even_if_nobody_took_it(store: Store) -> None:
    lock = held(store, "r", ttl=SHORT)
    lapse(lock)
    assert lock.renew(LONG) is False
    assert lock.lost
    assert store.inspect("r") is None


def test_renew_after_reacquire_returns_false_and_successor_untouched(
    store: Store, other: Store
) -> None:
    lock = held(store, "r", ttl=SHORT)
    lapse(lock)
    successor = held(other, "r", "w2", 30.0)
    before = other.inspect("r")
    assert lock.renew(LONG) is False
    assert lock.release() is False
    after = other.inspect("r")
    assert before == after or (
        after is not None and before is not None and after.expires_at == before.expires_at
    )
    assert after is not None and after.owner == "w2"
    assert successor.renew(LONG)


def test_foreign_owner_cannot_renew_the_current_tenure(store: Store, other: Store) -> None:
    old = held(other, "r", "intruder", SHORT)
    lapse(old)
    current = held(store, "r", "w1", 30.0)
    assert old.renew(LONG) is False  # a handle of another tenure/owner
    info = store.inspect("r")
    assert info is not None and info.owner == "w1" and info.remaining_s <= 30.0
    assert current.release()


def test_same_owner_string_does_not_renew_another_tenure(store: Store) -> None:
    first = held(store, "r", "same", SHORT)
    lapse(first)
    second = held(store, "r", "same", 30.0)
    assert first.renew(LONG) is False
    assert first.release() is False
    assert second.release() is True


# -- release ---------------------------------------------------------------------------------


def test_second_release_returns_false(store: Store) -> None:
    lock = held(store, "rel")
    assert lock.release() is True
    assert lock.release() is False
    assert lock.renew(LONG) is False


def test_release_after_lapse_returns_false(store: Store) -> None:
    lock = held(store, "rel", ttl=SHORT)
    lapse(lock)
    assert lock.release() is False
    assert store.inspect("rel") is None


def test_release_of_a_replaced_tenure_leaves_the_successor(store: Store, other: Store) -> None:
    lock = held(store, "rel", ttl=SHORT)
    lapse(lock)
    successor = held(other, "rel", "w2")
    assert lock.release() is False
    info = other.inspect("rel")
    assert info is not None and info.fencing_token == successor.fencing_token


def test_lock_as_context_manager_releases(store: Store) -> None:
    with held(store, "ctx") as lock:
        assert store.inspect("ctx") is not None
    assert store.inspect("ctx") is None
    assert lock.release() is False


# -- lapse -----------------------------------------------------------------------------------


def test_exclusion_lapses_at_expiry_with_a_larger_token(store: Store, other: Store) -> None:
    first = held(store, "lapse", ttl=SHORT)
    assert other.try_lock("lapse", "w2", LONG) is None
    lapse(first)
    second = held(other, "lapse", "w2")
    assert second.fencing_token > first.fencing_token
    assert first.renew(LONG) is False
    assert first.release() is False
    assert second.release() is True


# -- owner and name rules --------------------------------------------------------------------


@pytest.mark.parametrize("owner", BAD_OWNERS, ids=repr)
def test_owner_must_be_a_non_empty_string(store: Store, owner: object) -> None:
    with pytest.raises(InvalidLockOwner) as caught:
        store.try_lock("n", owner, LONG)  # type: ignore[arg-type]
    assert caught.value.kind is ErrorKind.INVALID_INPUT
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, StoreError)
    assert store.inspect("n") is None


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_bad_names_are_refused_identically(store: Store, name: object) -> None:
    for call in (
        lambda: store.try_lock(name, "w1", LONG),  # type: ignore[arg-type]
        lambda: store.lock(name, timeout=0),  # type: ignore[arg-type]
        lambda: store.inspect(name),  # type: ignore[arg-type]
        lambda: store.force_release(name),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidLockName) as caught:
            call()
        assert caught.value.kind is ErrorKind.INVALID_INPUT
        assert isinstance(caught.value, ValueError) and isinstance(caught.value, OrbitError)
    assert store.locks() == []


@pytest.mark.parametrize("name", GOOD_NAMES, ids=lambda name: repr(name)[:20])
def test_good_names_round_trip_exactly(store: Store, name: str) -> None:
    lock = held(store, name)
    info = store.inspect(name)
    assert info is not None and info.name == name and lock.name == name
    assert [found.name for found in store.locks()] == [name]
    assert lock.release()


def test_names_are_compared_exactly(store: Store) -> None:
    locks = [held(store, name) for name in ("a", "A", "a ", " a", "a/b", "a\\b")]
    assert len({lock.fencing_token for lock in locks}) == 6


# -- inspection and administration -----------------------------------------------------------


def test_inspect_and_locks_show_only_live_leases(store: Store) -> None:
    short = held(store, "b-short", "w1", SHORT)
    held(store, "c-long", "w2")
    held(store, "a-long", "w3")
    assert [info.name for info in store.locks()] == ["a-long", "b-short", "c-long"]
    lapse(short)
    infos = store.locks()
    assert [info.name for info in infos] == ["a-long", "c-long"]
    assert all(isinstance(info, LockInfo) and info.remaining_s > 0 for info in infos)
    assert store.inspect("b-short") is None
    assert store.inspect("never") is None


def test_force_release_removes_the_holder(store: Store, other: Store) -> None:
    lock = held(store, "f")
    assert other.force_release("f") is True
    assert other.force_release("f") is False
    assert lock.renew(LONG) is False
    assert lock.release() is False
    assert held(other, "f", "w2").fencing_token > lock.fencing_token


def test_statistics_count_this_store_objects_work(store: Store) -> None:
    lock = held(store, "s")
    assert store.try_lock("s", "w2", LONG) is None
    assert lock.renew(LONG)
    stats = store.statistics()
    assert (stats.acquired_count, stats.busy_count, stats.renewed_count) == (1, 1, 1)
    assert stats.held_count == 1
    assert lock.release()
    assert store.statistics().held_count == 0
    assert store.statistics().released_count == 1


def test_statistics_are_exact_under_threads(store: Store) -> None:
    def work(index: int) -> None:
        for _ in range(100):
            lock = held(store, f"t{index}", f"w{index}")
            assert lock.release()
            assert store.statistics().held_count >= 0  # reads overlap the counting

    threads = [threading.Thread(target=work, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = store.statistics()
    assert (stats.acquired_count, stats.released_count, stats.held_count) == (400, 400, 0)


def test_a_dropped_handle_is_not_counted_as_held(store: Store) -> None:
    kept = held(store, "kept")
    held(store, "dropped")  # the handle dies at once; its lease lapses in time
    gc.collect()
    assert store.statistics().held_count == 1
    assert len(store._backend._granted) == 1  # the dead handle took its reference with it
    assert kept.release()


# -- store lifecycle -------------------------------------------------------------------------


def test_store_context_manager_closes(store_url: str) -> None:
    with open_store(store_url) as store:
        lock = held(store, "life")
    for call in (lambda: store.try_lock("x", "w", 1.0), store.locks, lock.release):
        with pytest.raises(StoreError) as caught:
            call()
        assert caught.value.kind is ErrorKind.CLOSED
    store.close()  # idempotent
    assert "closed" in repr(store)


def test_closing_the_store_ends_a_waiting_lock_call_with_closed(store_url: str) -> None:
    store = open_store(store_url)
    holder = held(store, "wanted")
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            store.lock("wanted", "waiter", ttl=1.0, timeout=10.0)
        except BaseException as error:  # recorded for the assertion
            outcome.append(error)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.2)  # the waiter is in its wait loop
    store.close()
    waiter.join(15.0)
    assert not waiter.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], StoreError), outcome
    assert outcome[0].kind is ErrorKind.CLOSED
    with open_store(store_url) as again:
        assert again.force_release(holder.name)


def test_store_refuses_pickling(store: Store) -> None:
    with pytest.raises(TypeError, match="open_store"):
        pickle.dumps(store)


def test_forked_child_uses_the_store_on_its_own_connection(store: Store) -> None:
    parent_lock = held(store, "parent")
    pid = os.fork()
    if pid == 0:  # child: exit status tells the parent what happened
        code = 1
        try:
            child_lock = store.try_lock("child", "kid", LONG)
            if store.try_lock("parent", "kid", LONG) is None and child_lock is not None:
                code = 0 if child_lock.release() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert parent_lock.renew(LONG)  # the parent's connection is intact
    assert store.inspect("child") is None
    assert parent_lock.release()
