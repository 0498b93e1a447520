"""Fleet under odd arguments: only documented named errors.

``Fleet.join``, ``Fleet.local``, ``Fleet.observe`` and ``is_alive`` get the odd
values of :mod:`tests._odd` (hostile hooks and ints past 4300 digits among them),
mixed with ordinary ones.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orbitive import (
    AccessDenied,
    Fleet,
    FleetError,
    InvalidCapacity,
    InvalidName,
    LayoutMismatch,
    NodeOutsideFleet,
)

from .._fleets import fleet_files
from .._odd import call, odd

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
ERRORS = (InvalidName, InvalidCapacity, NodeOutsideFleet, FleetError, AccessDenied, LayoutMismatch)

capacities = st.one_of(st.sampled_from([1, 2, 4]), odd)
nodes = st.one_of(st.none(), st.integers(-2, 5), odd)


@SETTINGS
@given(
    use_name=st.booleans(),
    odd_name=odd,
    capacity=capacities,
    node=nodes,
    verb=st.sampled_from(["join", "local"]),
)
def test_join_and_local_refuse_odd_arguments_with_named_errors(
    fleet_name: str, use_name: bool, odd_name: object, capacity: object, node: object, verb: str
) -> None:
    name = fleet_name if use_name else odd_name
    args = (name, capacity) if node is None else (name, capacity, node)
    before = fleet_files(fleet_name)
    fleet, error = call(getattr(Fleet, verb), *args, allowed=ERRORS)
    if isinstance(fleet, Fleet):
        fleet.close()
    elif error is not None and verb == "local":
        assert fleet_files(fleet_name) == before  # a refused local fleet touches no file


@SETTINGS
@given(use_name=st.booleans(), odd_name=odd, capacity=capacities)
def test_observe_refuses_odd_arguments_with_named_errors(
    fleet_name: str, use_name: bool, odd_name: object, capacity: object
) -> None:
    fleet, _ = call(Fleet.observe, fleet_name if use_name else odd_name, capacity, allowed=ERRORS)
    if isinstance(fleet, Fleet):
        fleet.close()


@pytest.fixture
def joined(fleet_name: str) -> Iterator[Fleet]:
    """A joined fleet of capacity 4."""
    with Fleet.join(fleet_name, 4) as fleet:
        yield fleet


@SETTINGS
@given(node=nodes)
def test_is_alive_refuses_odd_nodes_with_named_errors(joined: Fleet, node: object) -> None:
    alive, _ = call(joined.is_alive, node, allowed=(NodeOutsideFleet, FleetError))
    assert alive in (None, True, False)
    life, _ = call(joined.incarnation_of, node, allowed=(NodeOutsideFleet, FleetError))
    assert life is None or life == joined.incarnation
