"""orbitive.pool under odd arguments: only documented named errors, and no state change.

The value types (Key, Incarnation, ResourceId, Limits) and every verb of a Pool
get the odd values of :mod:`tests._odd` mixed with ordinary ones. A call
either returns or raises a named error its docstring lists; after a refusal the
pool's statistics (keys, resources, reservations, claims) are what they were.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbitive import Fleet, NodeOutsideFleet, OrbitError
from orbitive.pool import (
    BusyError,
    CreationBudgetError,
    CreationPermit,
    DeathWatch,
    DrainingError,
    Execution,
    Incarnation,
    Key,
    KeyFullError,
    LaneFullError,
    LayoutMismatch,
    Lease,
    Limits,
    LocalFirst,
    MalformedError,
    NotOwnerError,
    NotReservedError,
    Pool,
    ResourceId,
    StaleError,
)
from orbitive.pool.session import FRAME_SIZE, SessionClosed, accept_session, open_session

from .._odd import blobs, call, numbers, odd

SETTINGS = settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
KEY = Key(0x5EED)
PEER_ERRORS = (MalformedError, StaleError, NotOwnerError)

keys = st.one_of(st.just(KEY), st.builds(Key, st.integers(0, 2**128 - 1)), odd)
counts = st.one_of(st.integers(0, 8), numbers, odd)


@pytest.fixture
def surface_pool(fleet_name: str) -> Iterator[Pool]:
    """A pool with small tables on a local fleet, holding one registered resource."""
    with Fleet.local(fleet_name, 4) as fleet, Pool(fleet, key_capacity=8, lane_capacity=8) as pool:
        yield pool


def resource(pool: Pool) -> ResourceId:
    """A resource of KEY this pool owns, registered again when an example closed it."""
    for candidate in pool.candidates(KEY):
        if candidate.local and candidate.state == "live":
            return candidate.id
    return pool.register(KEY, 4)


def refused_leaves_state(
    pool: Pool, verb: str, *args: Any, allowed: tuple[type[OrbitError], ...]
) -> object:
    """Call ``pool.<verb>``; on a named error the statistics must be unchanged."""
    before = pool.statistics()
    result, error = call(getattr(pool, verb), *args, allowed=allowed)
    if error is not None:
        assert pool.statistics() == before, f"state changed after {error!r}"
    return result


def settle(result: object) -> None:
    """Give back what a successful call handed out, so examples stay independent."""
    for item in result if isinstance(result, tuple) else (result,):
        if isinstance(item, Execution):
            item.complete()
        elif isinstance(item, CreationPermit):
            item.finish()
        elif isinstance(item, DeathWatch):
            item.close()


@SETTINGS
@given(value=odd)
def test_value_types_take_odd_values(value: object) -> None:
    for build in (Key, Key.from_bytes, Key.digest, Incarnation):
        call(build, value, allowed=(MalformedError,))
    call(ResourceId.from_raw, value, 1, allowed=(MalformedError,))
    call(ResourceId.from_raw, 1 << 16, value, allowed=(MalformedError,))


@SETTINGS
@given(data=blobs)
def test_key_digest_reads_only_bytes_likes(data: object) -> None:
    key, _ = call(Key.digest, data, allowed=(MalformedError,))
    assert key is None or type(key) is Key


@SETTINGS
@given(fields=st.lists(st.one_of(st.integers(0, 300), odd), min_size=5, max_size=5))
def test_resource_id_takes_odd_fields(fields: list[object]) -> None:
    call(ResourceId, *fields, allowed=(MalformedError,))


@SETTINGS
@given(max_live=counts, attempts=counts)
def test_limits_take_odd_values(max_live: object, attempts: object) -> None:
    call(Limits, max_live, attempts, allowed=(MalformedError,))


@SETTINGS
@given(incarnation=st.one_of(st.none(), odd), kind=st.one_of(st.just(247), odd))
def test_pool_constructor_takes_odd_values(
    surface_pool: Pool, incarnation: object, kind: object
) -> None:
    fleet = surface_pool._fleet
    made, _ = call(
        Pool,
        fleet,
        incarnation,
        kind=kind,
        key_capacity=8,
        lane_capacity=8,
        allowed=(MalformedError, LayoutMismatch),
    )
    if isinstance(made, Pool):
        made.close()


@SETTINGS
@given(
    key=keys,
    limits=st.one_of(st.just(Limits(4)), odd),
    policy=st.one_of(st.just(LocalFirst()), odd),
)
def test_acquire_refuses_with_named_errors_and_no_change(
    surface_pool: Pool, key: object, limits: object, policy: object
) -> None:
    resource(surface_pool)
    allowed = (MalformedError, KeyFullError)
    plan = refused_leaves_state(surface_pool, "acquire", key, limits, policy, allowed=allowed)
    lease = getattr(plan, "lease", None)
    if lease is not None:
        surface_pool.cancel_reservation(lease)
    settle(getattr(plan, "permit", None))


@SETTINGS
@given(rid=st.one_of(st.just(None), odd), verb=st.sampled_from(["reserve", "drain", "unregister"]))
def test_resource_verbs_refuse_with_named_errors_and_no_change(
    surface_pool: Pool, rid: object, verb: str
) -> None:
    real = resource(surface_pool)
    target = real if rid is None else rid
    allowed = (*PEER_ERRORS, DrainingError, BusyError, LayoutMismatch)
    result = refused_leaves_state(surface_pool, verb, target, allowed=allowed)
    if isinstance(result, Lease):
        surface_pool.cancel_reservation(result)


def odd_lease(data: st.DataObject, real: Lease) -> object:
    """``real``, a Lease with one field replaced by an odd value, or any odd value."""
    field = data.draw(st.sampled_from(["none", "id", "fence", "holder_node", "holder_incarnation"]))
    fields: dict[str, Any] = {"id": real.id, "fence": real.fence, "holder_node": real.holder_node}
    fields["holder_incarnation"] = real.holder_incarnation
    if field != "none":
        fields[field] = data.draw(odd)
    return data.draw(odd) if data.draw(st.booleans()) else Lease(**fields)


def give_back(pool: Pool, lease: Lease) -> None:
    """Cancel ``lease`` unless an example accepted or cancelled it already."""
    with contextlib.suppress(NotReservedError):
        pool.cancel_reservation(lease)


@SETTINGS
@given(data=st.data(), verb=st.sampled_from(["accept", "cancel_reservation"]))
def test_lease_verbs_refuse_with_named_errors_and_no_change(
    surface_pool: Pool, data: st.DataObject, verb: str
) -> None:
    real = surface_pool.reserve(resource(surface_pool))
    lease = odd_lease(data, real)
    allowed = (*PEER_ERRORS, DrainingError, NotReservedError, LayoutMismatch)
    settle(refused_leaves_state(surface_pool, verb, lease, allowed=allowed))
    give_back(surface_pool, real)


@SETTINGS
@given(data=st.data(), payload=st.one_of(st.just(b"payload"), blobs, odd))
def test_open_session_refuses_odd_leases_and_payloads_before_writing(
    surface_pool: Pool, data: st.DataObject, payload: object
) -> None:
    real = surface_pool.reserve(resource(surface_pool))
    lease = odd_lease(data, real)
    ours, theirs = socket.socketpair()
    with ours, theirs:
        _, error = call(open_session, lease, ours, payload, allowed=(MalformedError,))
        theirs.setblocking(False)
        if error is not None:  # nothing was written
            with pytest.raises(BlockingIOError):
                theirs.recv(1)
        else:
            allowed = (*PEER_ERRORS, DrainingError, NotReservedError, LayoutMismatch)
            settle(call(accept_session, surface_pool, theirs, allowed=allowed)[0])
    give_back(surface_pool, real)


@SETTINGS
@given(frame=st.one_of(st.binary(min_size=1, max_size=FRAME_SIZE + 4), blobs))
def test_accept_session_refuses_odd_frames_with_named_errors_and_no_change(
    surface_pool: Pool, frame: object
) -> None:
    raw = frame if type(frame) is bytes else b"x"
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(raw)
        ours.shutdown(socket.SHUT_WR)
        allowed = (*PEER_ERRORS, NotReservedError, DrainingError, SessionClosed)
        before = surface_pool.statistics()
        _, error = call(accept_session, surface_pool, theirs, allowed=allowed)
        assert error is None or surface_pool.statistics() == before


@SETTINGS
@given(key=keys, capacity=counts, verb=st.sampled_from(["register", "register_active"]))
def test_register_refuses_with_named_errors_and_no_change(
    surface_pool: Pool, key: object, capacity: object, verb: str
) -> None:
    allowed = (MalformedError, KeyFullError, LaneFullError, LayoutMismatch)
    result = refused_leaves_state(surface_pool, verb, key, capacity, allowed=allowed)
    settle(result)
    rid = result[0] if isinstance(result, tuple) else result
    if isinstance(rid, ResourceId):
        surface_pool.unregister(rid)


@SETTINGS
@given(rid=st.one_of(st.just(None), odd), active=counts, grace=st.one_of(numbers, odd))
def test_reconcile_refuses_with_named_errors_and_no_change(
    surface_pool: Pool, rid: object, active: object, grace: object
) -> None:
    real = resource(surface_pool)
    target = real if rid is None else rid
    refused_leaves_state(surface_pool, "reconcile", target, active, grace, allowed=PEER_ERRORS)
    surface_pool.reconcile(real, 0, 0)


@SETTINGS
@given(key=keys, max_live=counts)
def test_claim_create_refuses_with_named_errors_and_no_change(
    surface_pool: Pool, key: object, max_live: object
) -> None:
    allowed = (MalformedError, KeyFullError, CreationBudgetError)
    settle(refused_leaves_state(surface_pool, "claim_create", key, max_live, allowed=allowed))


@SETTINGS
@given(key=keys, verb=st.sampled_from(["candidates", "budget", "version", "watch"]))
def test_key_lookups_refuse_with_named_errors_and_no_change(
    surface_pool: Pool, key: object, verb: str
) -> None:
    refused_leaves_state(surface_pool, verb, key, allowed=(MalformedError, KeyFullError))


@SETTINGS
@given(
    key=keys,
    since=counts,
    timeout=st.one_of(st.none(), numbers, odd),
    verb=st.sampled_from(["wait_capacity", "poll_capacity"]),
)
def test_waits_refuse_with_named_errors_and_no_change(
    surface_pool: Pool, key: object, since: object, timeout: object, verb: str
) -> None:
    if since is None or timeout is None or _waits(timeout):
        timeout = 0  # a valid wait would park the test; zero keeps the call immediate
    allowed = (MalformedError, KeyFullError)
    if verb == "poll_capacity":
        before = surface_pool.statistics()
        _, error = call(asyncio.run, _poll(surface_pool, key, since, timeout), allowed=allowed)
        assert error is None or surface_pool.statistics() == before
    else:
        refused_leaves_state(surface_pool, verb, key, since, timeout, allowed=allowed)


async def _poll(pool: Pool, key: Any, since: Any, timeout: Any) -> int | None:
    return await pool.poll_capacity(key, since, timeout)


def _waits(timeout: object) -> bool:
    """Whether ``timeout`` is seconds above zero as the pool takes them (int or float)."""
    return (type(timeout) is int or type(timeout) is float) and timeout > 0


@SETTINGS
@given(node=counts, incarnation=st.one_of(counts, st.builds(Incarnation, st.integers(1, 9))))
def test_node_dead_refuses_with_named_errors_and_no_change(
    surface_pool: Pool, node: object, incarnation: object
) -> None:
    resource(surface_pool)
    allowed = (NodeOutsideFleet, MalformedError)
    refused_leaves_state(surface_pool, "node_dead", node, incarnation, allowed=allowed)


@SETTINGS
@given(interval=st.one_of(numbers, odd), on_death=st.one_of(st.none(), odd))
def test_watch_deaths_refuses_with_named_errors(
    surface_pool: Pool, interval: object, on_death: object
) -> None:
    settle(
        refused_leaves_state(
            surface_pool, "watch_deaths", interval, on_death, allowed=(MalformedError,)
        )
    )
