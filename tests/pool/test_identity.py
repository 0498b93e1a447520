"""Who a Pool acts as: a forked child is a new life; explicit lives and observers are held to it."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from multiprocessing.connection import Connection

import pytest

from orbitive import Fleet
from orbitive._core._errors import FleetError, MalformedError, NotOwnerError
from orbitive.pool import Incarnation, Key, Pool

KEY = Key(99)
FORK = multiprocessing.get_context("fork")


def _in_child(job: Callable[[], object]) -> object:
    """Run ``job`` in a forked child; return its result or the exception it raised."""
    parent, child = FORK.Pipe()

    def run(conn: Connection) -> None:
        try:
            conn.send(job())
        except Exception as error:
            conn.send(error)

    process = FORK.Process(target=run, args=(child,))
    process.start()
    result = parent.recv() if parent.poll(30.0) else TimeoutError("child did not answer")
    process.join(10.0)
    return result


def test_child_gets_its_own_node_and_life_and_cannot_accept_parent_leases(
    shm_pool: Pool,
) -> None:
    rid = shm_pool.register(KEY, 2)
    lease = shm_pool.reserve(rid)
    parent_identity = (shm_pool.node, shm_pool.incarnation)

    def child() -> object:
        identity = (shm_pool.node, shm_pool.incarnation)
        try:
            shm_pool.accept(lease)
        except NotOwnerError:
            refused = True
        else:
            refused = False
        own = shm_pool.register(KEY, 1)
        return identity, refused, own.node

    result = _in_child(child)
    assert isinstance(result, tuple)
    identity, refused, own_node = result
    assert identity != parent_identity
    assert refused
    assert own_node == identity[0] != parent_identity[0]
    with shm_pool.accept(lease):  # still the parent's to accept
        pass


def test_execution_copied_into_a_child_never_completes_the_parents_unit(
    shm_pool: Pool,
) -> None:
    rid = shm_pool.register(KEY, 1)
    execution = shm_pool.accept(shm_pool.reserve(rid))

    def child() -> object:
        execution.complete()
        return shm_pool.candidates(KEY)[0].active

    assert _in_child(child) == 1
    assert shm_pool.candidates(KEY)[0].active == 1
    execution.complete()
    assert shm_pool.candidates(KEY)[0].active == 0


def test_pool_with_explicit_incarnation_refuses_use_in_a_child(shm_fleet: Fleet) -> None:
    with Pool(shm_fleet, Incarnation(shm_fleet.incarnation)) as pool:
        assert isinstance(_in_child(lambda: pool.version(KEY)), FleetError)
        pool.version(KEY)  # the parent's handle is unaffected


def test_second_pool_in_a_process_with_another_incarnation_is_refused(
    shm_pool: Pool, shm_fleet: Fleet
) -> None:
    with pytest.raises(MalformedError):
        Pool(shm_fleet, Incarnation(shm_pool.incarnation + 1))
    with Pool(shm_fleet) as same:
        assert same.incarnation == shm_pool.incarnation


def test_an_observer_fleet_cannot_open_a_pool(shm_fleet: Fleet) -> None:
    with pytest.raises(FleetError):
        Pool(Fleet.observe(shm_fleet.name, shm_fleet.capacity))
