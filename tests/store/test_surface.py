"""orbitive.store under odd arguments: only documented named errors, and no state change.

``open_store`` and every verb of a Store, a Lock, a Semaphore and its lease get the odd
values of
:mod:`tests._odd` mixed with ordinary ones, on every engine. A call either returns
or raises a named error its docstring lists; after a refusal the store's live
locks and its counters are what they were.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbitive import AccessDenied, InvalidArgumentType, LayoutMismatch, OrbitError
from orbitive._core._clock import as_seconds
from orbitive._core._errors import InvalidTtl
from orbitive.store import (
    InvalidLockName,
    InvalidLockOwner,
    InvalidLockTtl,
    InvalidSemaphoreLimit,
    InvalidStoreUrl,
    Lock,
    LockTimeout,
    SemaphoreLimitMismatch,
    Store,
    StoreError,
    open_store,
)

from .._odd import call, numbers, odd, texts

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
HELD = "surface/held"
GUARD_ERRORS = (InvalidLockName, InvalidLockOwner, InvalidLockTtl)
_FLEET_NAME = re.compile(r"[A-Za-z0-9._-]{1,32}")

names = st.one_of(st.just(HELD), st.just("surface/free"), texts, odd)
owners = st.one_of(st.just("surface-owner"), texts, odd)
durations = st.one_of(st.just(30.0), numbers, odd)


def no_fleet(text: str) -> bool:
    """Whether ``shm://`` + ``text`` names no valid fleet (so no SHM object is made)."""
    try:
        netloc = urlsplit("shm://" + text).netloc
    except ValueError:
        return True
    return not _FLEET_NAME.fullmatch(netloc) or netloc in (".", "..")


def urls(directory: Path) -> st.SearchStrategy[object]:
    """Odd URLs that stay on this host: files under ``directory``, loopback port 1."""
    plain = st.text(st.characters(categories=["Ll", "Nd", "Cs"]), max_size=6)
    return st.one_of(
        odd.filter(lambda value: not isinstance(value, str)),
        st.builds(lambda text: f"sqlite://{directory}/{text}", texts.filter(_is_str)),
        st.builds(lambda text: f"sqlite:{text}", plain),
        st.builds(lambda text: f"shm://{text}", st.text(max_size=8).filter(no_fleet)),
        st.builds(lambda text: f"postgresql://127.0.0.1:1/{text}", plain),
        st.sampled_from(["", "sqlite:", "bogus://x", "shm://[::1", "postgres://%zz", "\ud800:x"]),
    )


def _is_str(value: object) -> bool:
    return type(value) is str


@pytest.fixture
def surface_store(store: Store) -> Iterator[Store]:
    """The engine's store, with HELD held by another owner for the whole test, as a lock
    and as the one slot of a semaphore of limit 1."""
    other = store.try_lock(HELD, "someone-else", 120.0)
    slot = store.semaphore(HELD, 1).try_acquire("someone-else", 120.0)
    assert other is not None and slot is not None
    yield store
    other.release()
    slot.release()


def snapshot(store: Store) -> tuple[object, ...]:
    """What a refused call must leave alone: the live locks, the semaphores' holders and
    the store's counters."""
    stats = store.statistics()
    held = frozenset((info.name, info.owner, info.fencing_token) for info in store.locks())
    slots = frozenset((i.name, i.slot, i.fencing_token) for i in store.semaphores())
    counts = (stats.acquired_count, stats.busy_count, stats.renewed_count, stats.released_count)
    return held, slots, counts


def refused_leaves_state(
    store: Store,
    verb: Callable[..., object],
    *args: Any,
    allowed: tuple[type[OrbitError], ...],
    **kwargs: Any,
) -> object:
    """Call ``verb``; on a named error the store must be as it was before."""
    before = snapshot(store)
    result, error = call(verb, *args, allowed=allowed, **kwargs)
    if isinstance(error, LockTimeout):  # not a refusal: the attempts counted as busy
        assert snapshot(store)[0] == before[0], f"locks changed after {error!r}"
    elif error is not None:
        assert snapshot(store) == before, f"state changed after {error!r}"
    if isinstance(result, Lock):  # a SemaphoreLease too
        result.release()
    return result


@SETTINGS
@given(data=st.data())
def test_open_store_refuses_odd_urls_with_named_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data: st.DataObject
) -> None:
    monkeypatch.chdir(tmp_path)  # sqlite:relative paths land here
    url = data.draw(urls(tmp_path))
    allowed = (InvalidStoreUrl, StoreError, AccessDenied, LayoutMismatch)
    store, _ = call(open_store, url, allowed=allowed)
    if isinstance(store, Store):
        store.close()


@SETTINGS
@given(name=names, owner=owners, ttl=durations)
def test_try_lock_refuses_with_named_errors_and_no_change(
    surface_store: Store, name: object, owner: object, ttl: object
) -> None:
    verb = surface_store.try_lock
    refused_leaves_state(surface_store, verb, name, owner, ttl, allowed=GUARD_ERRORS)


@SETTINGS
@given(
    name=names,
    owner=st.one_of(st.none(), owners),
    ttl=durations,
    timeout=st.one_of(st.none(), numbers, odd),
    auto_renew=st.one_of(st.booleans(), odd),
    on_lost=st.one_of(st.none(), st.just(print), odd),
)
def test_lock_refuses_with_named_errors_and_no_change(
    surface_store: Store,
    name: object,
    owner: object,
    ttl: object,
    timeout: object,
    auto_renew: object,
    on_lost: object,
) -> None:
    if timeout is None or _waits(timeout):
        timeout = 0  # one attempt: a valid wait on HELD would park the test
    allowed = (*GUARD_ERRORS, InvalidTtl, InvalidArgumentType, LockTimeout)
    kwargs: dict[str, Any] = {"auto_renew": auto_renew, "on_lost": on_lost}
    args: tuple[Any, ...] = (name, owner, ttl, timeout)
    refused_leaves_state(surface_store, surface_store.lock, *args, **kwargs, allowed=allowed)


def _waits(timeout: object) -> bool:
    """Whether ``timeout`` is a number of seconds above zero (a float subclass too)."""
    try:
        return as_seconds(timeout, "timeout") > 0.0
    except InvalidTtl:
        return False


@SETTINGS
@given(name=names, verb=st.sampled_from(["inspect", "force_release"]))
def test_name_lookups_refuse_with_named_errors_and_no_change(
    surface_store: Store, name: object, verb: str
) -> None:
    method = getattr(surface_store, verb)
    result = refused_leaves_state(surface_store, method, name, allowed=(InvalidLockName,))
    if result is True:  # force_release took HELD: hold it again for the next example
        assert surface_store.try_lock(HELD, "someone-else", 120.0) is not None


@SETTINGS
@given(ttl=durations)
def test_lock_renew_refuses_with_named_errors_and_no_change(
    surface_store: Store, ttl: object
) -> None:
    lock = surface_store.try_lock("surface/renewed", "surface-owner", 30.0)
    assert lock is not None
    try:
        renewed = refused_leaves_state(surface_store, lock.renew, ttl, allowed=(InvalidLockTtl,))
        if renewed is None:  # refused: the tenure is untouched (a renewal may be 1 ms long)
            assert not lock.lost
    finally:
        lock.release()


limits = st.one_of(st.just(1), st.just(2), numbers, odd)


@SETTINGS
@given(name=names, limit=limits, owner=owners, ttl=durations)
def test_semaphore_try_acquire_refuses_with_named_errors_and_no_change(
    surface_store: Store, name: object, limit: object, owner: object, ttl: object
) -> None:
    semaphore, error = call(
        surface_store.semaphore, name, limit, allowed=(InvalidLockName, InvalidSemaphoreLimit)
    )
    if error is None:  # HELD is held under limit 1: another limit is a named mismatch
        allowed = (*GUARD_ERRORS, SemaphoreLimitMismatch)
        verb = semaphore.try_acquire  # type: ignore[attr-defined]
        refused_leaves_state(surface_store, verb, owner, ttl, allowed=allowed)


@SETTINGS
@given(
    owner=st.one_of(st.none(), owners),
    ttl=durations,
    timeout=st.one_of(st.none(), numbers, odd),
    auto_renew=st.one_of(st.booleans(), odd),
    on_lost=st.one_of(st.none(), st.just(print), odd),
    asynchronous=st.booleans(),
)
def test_semaphore_acquire_refuses_with_named_errors_and_no_change(
    surface_store: Store,
    owner: object,
    ttl: object,
    timeout: object,
    auto_renew: object,
    on_lost: object,
    asynchronous: bool,
) -> None:
    if timeout is None or _waits(timeout):
        timeout = 0  # one attempt: a valid wait on HELD would park the test
    allowed = (*GUARD_ERRORS, InvalidTtl, InvalidArgumentType, LockTimeout)
    kwargs: dict[str, Any] = {"auto_renew": auto_renew, "on_lost": on_lost}
    semaphore = surface_store.semaphore(HELD, 1)
    verb = semaphore.acquire_async if asynchronous else semaphore.acquire  # async: checks only
    refused_leaves_state(surface_store, verb, owner, ttl, timeout, **kwargs, allowed=allowed)


@SETTINGS
@given(ttl=durations)
def test_semaphore_lease_renew_refuses_with_named_errors_and_no_change(
    surface_store: Store, ttl: object
) -> None:
    lease = surface_store.semaphore("surface/renewed", 2).try_acquire("surface-owner", 30.0)
    assert lease is not None
    try:
        renewed = refused_leaves_state(surface_store, lease.renew, ttl, allowed=(InvalidLockTtl,))
        if renewed is None:  # refused: the tenure is untouched
            assert not lease.lost
    finally:
        lease.release()


def test_a_postgres_url_urllib_cannot_split_opens_and_shows_none_of_it(postgres_url: str) -> None:
    head, rest = postgres_url.split("://", 1)
    user, host = rest.split("@", 1)
    with open_store(f"{head}://{user}:pw]x@{host}") as store:  # libpq reads it; urllib cannot
        assert store.url == "postgresql://***"
        assert store.try_lock("surface/odd-url", "owner", 30.0) is not None
