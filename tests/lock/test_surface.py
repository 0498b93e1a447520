"""orbitive.lock under odd arguments: only documented named errors, and no state change.

Every public verb of LockKey, LockOwner, LockLayout, Fence and LockTable is driven
with the odd values of :mod:`tests._odd` mixed with ordinary ones. A call
either returns or raises one of the named errors its docstring lists; after a
refusal the table's live leases and its counters are exactly what they were.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbitive import Fleet, InvalidArgumentType, OrbitError
from orbitive.lock import (
    EntryTooLarge,
    Fence,
    InvalidEncoding,
    InvalidLayout,
    InvalidTtl,
    KeyEmpty,
    LockKey,
    LockLayout,
    LockLease,
    LockOwner,
    LockTable,
    NamespaceEmpty,
    OwnerEmpty,
    StateFull,
)

from .._odd import blobs, call, odd, texts

KEY_ERRORS = (NamespaceEmpty, KeyEmpty, EntryTooLarge, InvalidEncoding, InvalidArgumentType)
OWNER_ERRORS = (OwnerEmpty, InvalidEncoding, InvalidArgumentType)
#: A (key, owner) pair: either part's errors, or the pair too large for a slot.
ENTRY_ERRORS = (*KEY_ERRORS, *OWNER_ERRORS, EntryTooLarge)
HELD = LockKey("surface", "held")
ME = LockOwner(b"surface-owner")
#: Fields of a lease a caller may tamper with. ``slot`` is pinned apart
#: (test_odd_arguments): a hostile int there still escapes the table.
LEASE_FIELDS = ["key", "owner", "lock_id", "state_revision", "acquired_at", "expires_at"]

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

parts = st.one_of(texts, blobs, st.sampled_from(["ns", b"label"]), odd)
keys = st.one_of(st.just(HELD), st.builds(LockKey, st.just("surface"), st.text(min_size=1)), odd)
owners = st.one_of(st.just(ME), st.just(b"other"), parts)


@pytest.fixture
def surface_table(fleet_name: str) -> Iterator[LockTable]:
    """A small lock table on a local fleet (no SHM objects to leave behind)."""
    with Fleet.local(fleet_name, 2) as fleet:
        table = LockTable(fleet, LockLayout(capacity=16, payload_max=96, frame_bytes=160))
        yield table
        table.close()


def snapshot(table: LockTable) -> tuple[object, ...]:
    """What a refused call must leave alone: counters, probe bound and long-lived leases."""
    stats = table.statistics()
    now = time.monotonic()
    leases = frozenset(
        (lease.key, lease.owner, lease.lock_id, lease.state_revision)
        for lease in table.leases()
        if lease.expires_at - now > 5.0
    )
    return stats.last_fencing_token, stats.last_state_revision, stats.max_probe, leases


def held_lease(table: LockTable) -> LockLease:
    """The live lease of HELD, acquired again when an example released it."""
    lease = table.current(HELD)
    if lease is None:
        result = table.try_acquire(HELD, ME, 60.0)
        lease = result.lease
    return lease


def refused_leaves_state(
    table: LockTable, verb: Callable[..., object], *args: Any, allowed: tuple[type[OrbitError], ...]
) -> None:
    """Call ``verb``; on a named error, the table must be as it was before."""
    before = snapshot(table)
    _, error = call(verb, *args, allowed=allowed)
    if error is not None:
        assert snapshot(table) == before, f"state changed after {error!r}"


@SETTINGS
@given(namespace=parts, label=parts)
def test_lock_key_takes_odd_parts(namespace: object, label: object) -> None:
    key, _ = call(LockKey, namespace, label, allowed=KEY_ERRORS)
    if key is not None:
        assert isinstance(key, LockKey)
        assert type(key.namespace) is bytes and type(key.label) is bytes


@SETTINGS
@given(typ=odd, label=parts)
def test_lock_key_of_takes_odd_types(typ: object, label: object) -> None:
    call(LockKey.of, typ, label, allowed=KEY_ERRORS)


@SETTINGS
@given(value=parts)
def test_lock_owner_takes_odd_values(value: object) -> None:
    owner, _ = call(LockOwner, value, allowed=OWNER_ERRORS)
    if owner is not None:
        assert isinstance(owner, LockOwner) and type(owner.value) is bytes


@SETTINGS
@given(field=st.sampled_from(list(LockLayout.__dataclass_fields__)), value=odd)
def test_lock_layout_takes_odd_values(field: str, value: object) -> None:
    call(LockLayout, **{field: value}, allowed=(InvalidLayout,))


@SETTINGS
@given(high_water=odd, token=odd)
def test_fence_takes_odd_tokens(high_water: object, token: object) -> None:
    fence, _ = call(Fence, high_water, allowed=(InvalidArgumentType,))
    if fence is not None:
        assert isinstance(fence, Fence)
        mark = fence.high_water
        _, error = call(fence.admit, token, allowed=(InvalidArgumentType,))
        if error is not None:
            assert fence.high_water == mark


@SETTINGS
@given(key=keys, owner=owners, ttl=odd)
def test_try_acquire_refuses_with_named_errors_and_no_change(
    surface_table: LockTable, key: object, owner: object, ttl: object
) -> None:
    held_lease(surface_table)
    allowed = (*ENTRY_ERRORS, InvalidTtl, StateFull)
    refused_leaves_state(surface_table, surface_table.try_acquire, key, owner, ttl, allowed=allowed)


@SETTINGS
@given(data=st.data(), ttl=odd)
def test_renew_refuses_with_named_errors_and_no_change(
    surface_table: LockTable, data: st.DataObject, ttl: object
) -> None:
    lease = odd_lease(data, held_lease(surface_table))
    verb = surface_table.renew
    refused_leaves_state(surface_table, verb, lease, ttl, allowed=(InvalidTtl, InvalidArgumentType))


@SETTINGS
@given(data=st.data())
def test_release_refuses_with_named_errors_and_no_change(
    surface_table: LockTable, data: st.DataObject
) -> None:
    lease = odd_lease(data, held_lease(surface_table))
    refused_leaves_state(
        surface_table, surface_table.release, lease, allowed=(InvalidArgumentType,)
    )


def odd_lease(data: st.DataObject, real: LockLease) -> object:
    """The real lease, one with a tampered field, or any odd value."""
    choice = data.draw(st.sampled_from(["real", "tampered", "odd"]))
    if choice == "real":
        return real
    if choice == "odd":
        return data.draw(odd)
    field = data.draw(st.sampled_from(LEASE_FIELDS))
    tampered: dict[str, Any] = {field: data.draw(odd)}
    return real._replace(**tampered)


@SETTINGS
@given(key=keys, owner=owners, ttl=odd)
def test_renew_owned_refuses_with_named_errors_and_no_change(
    surface_table: LockTable, key: object, owner: object, ttl: object
) -> None:
    held_lease(surface_table)
    verb, allowed = surface_table.renew_owned, (*ENTRY_ERRORS, InvalidTtl)
    refused_leaves_state(surface_table, verb, key, owner, ttl, allowed=allowed)


@SETTINGS
@given(key=keys, owner=owners, verb=st.sampled_from(["release_owned", "restore"]))
def test_owned_lookups_refuse_with_named_errors_and_no_change(
    surface_table: LockTable, key: object, owner: object, verb: str
) -> None:
    held_lease(surface_table)
    method = getattr(surface_table, verb)
    refused_leaves_state(surface_table, method, key, owner, allowed=ENTRY_ERRORS)


@SETTINGS
@given(key=keys, verb=st.sampled_from(["force_release", "current"]))
def test_key_lookups_refuse_with_named_errors_and_no_change(
    surface_table: LockTable, key: object, verb: str
) -> None:
    held_lease(surface_table)
    method = getattr(surface_table, verb)
    refused_leaves_state(surface_table, method, key, allowed=(InvalidArgumentType,))
