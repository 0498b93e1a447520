"""Readiness: a publish in another process makes this process's descriptor readable.

The descriptor is a socket the publisher writes to (``_core._channel``): the same
whatever the word backend, and no thread runs for it.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import signal
import threading
from pathlib import Path

import pytest

from orbitive import Fleet
from orbitive._core._channel import SOCKETS_PER_NODE, Channel
from orbitive._core._errors import AccessDenied, FleetError, InvalidLayout
from orbitive._core._readiness import Readiness
from orbitive._core._region import Region

from ._shared import (
    CAPACITY,
    PARKED,
    SIZE,
    Job,
    channel,
    child_publish,
    open_region,
    read_word,
    unique_fleet_name,
)
from ._shared import signal as publish
from .conftest import Context, Shm, Start

BOUND = 2.0  # seconds: generous, the usual figure is well under a millisecond


def readable(fd: int, timeout: float) -> bool:
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        return bool(selector.select(timeout))


def watch(shm: Shm) -> Readiness:
    return Readiness(channel(shm.region), shm.fleet.node, "test-readiness")


def test_child_publish_makes_descriptor_readable_and_drain_clears_it(
    shm: Shm, context: Context, children: Start
) -> None:
    ready, go = context.Event(), context.Event()
    child = children(child_publish, Job(shm.name, None), ready, go)
    assert ready.wait(30)
    readiness = watch(shm)
    try:
        assert not readable(readiness.fileno(), 0.05)
        go.set()
        assert readable(readiness.fileno(), BOUND)
        child.join(30)
        assert child.exitcode == 0
        assert readiness.drain() == 1
        assert not readable(readiness.fileno(), 0.1)
    finally:
        readiness.close()


def test_burst_of_publishes_is_one_signal_until_the_drain_arms_again(
    shm: Shm, context: Context, children: Start
) -> None:
    ready, go = context.Event(), context.Event()
    child = children(child_publish, Job(shm.name, None, count=5), ready, go)
    assert ready.wait(30)
    start = read_word(shm.region.buf)
    readiness = watch(shm)
    try:
        go.set()
        assert readable(readiness.fileno(), BOUND)
        child.join(30)
        assert child.exitcode == 0
        assert read_word(shm.region.buf) == start + 5
        assert readiness.drain() == 1  # the first publish took the bit; the others skipped it
        assert not readable(readiness.fileno(), 0.05)
        publish(shm.region)  # armed again by the drain
        assert readable(readiness.fileno(), BOUND)
        assert readiness.drain() == 1
    finally:
        readiness.close()


def test_child_publish_wakes_an_asyncio_reader(shm: Shm, context: Context, children: Start) -> None:
    ready, go = context.Event(), context.Event()
    child = children(child_publish, Job(shm.name, None), ready, go)
    assert ready.wait(30)
    readiness = watch(shm)

    async def first_drain() -> int:
        loop = asyncio.get_running_loop()
        drained: asyncio.Future[int] = loop.create_future()

        def on_readable() -> None:
            if not drained.done():
                drained.set_result(readiness.drain())

        loop.add_reader(readiness.fileno(), on_readable)
        try:
            go.set()
            return await asyncio.wait_for(drained, BOUND)
        finally:
            loop.remove_reader(readiness.fileno())

    try:
        assert asyncio.run(first_drain()) == 1
        child.join(30)
        assert child.exitcode == 0
    finally:
        readiness.close()


def test_publisher_thread_over_a_local_fleet() -> None:
    with Fleet.local(unique_fleet_name(), CAPACITY, node=2) as fleet:
        region = open_region(fleet)
        readiness = Readiness(channel(region), fleet.node, "test-local")
        try:
            threading.Thread(target=publish, args=(region,)).start()
            assert readable(readiness.fileno(), BOUND)
            assert readiness.drain() == 1
        finally:
            readiness.close()


def test_no_thread_runs_and_close_is_idempotent_and_removes_the_socket(shm: Shm) -> None:
    threads = threading.active_count()
    readiness = watch(shm)
    path = Path(channel(shm.region).path(shm.fleet.node, 0))
    assert threading.active_count() == threads
    assert path.is_socket() and (path.stat().st_mode & 0o777) == 0o600
    assert shm.region.buf[PARKED + shm.fleet.node] == 1  # bit 0: armed
    readiness.close()
    readiness.close()
    assert not path.exists()
    with pytest.raises(FleetError, match="closed"):
        readiness.fileno()
    with pytest.raises(FleetError, match="closed"):
        readiness.drain()
    assert "closed" in repr(readiness)
    publish(shm.region)  # takes the stale bit: a missing socket is no error
    assert shm.region.buf[PARKED + shm.fleet.node] == 0


def test_two_descriptors_of_one_node_each_get_the_signal_and_the_ninth_is_refused(
    shm: Shm,
) -> None:
    watched = channel(shm.region)
    descriptors = [Readiness(watched, shm.fleet.node, f"test-{n}") for n in range(2)]
    try:
        publish(shm.region)
        assert all(readable(one.fileno(), BOUND) for one in descriptors)
        assert [one.drain() for one in descriptors] == [1, 1]
        descriptors += [
            Readiness(watched, shm.fleet.node, f"test-{n}") for n in range(2, SOCKETS_PER_NODE)
        ]
        with pytest.raises(FleetError, match=f"{SOCKETS_PER_NODE} descriptors"):
            Readiness(watched, shm.fleet.node, "test-one-too-many")
    finally:
        for one in descriptors:
            one.close()


def test_drain_after_the_region_closed_raises_fleet_error(shm: Shm) -> None:
    with Fleet.join(shm.name, CAPACITY) as fleet:
        region = open_region(fleet)
        readiness = Readiness(channel(region), fleet.node, "test-closed")
        try:
            publish(shm.region)
            assert readable(readiness.fileno(), BOUND)
            region.close()
            with pytest.raises(FleetError, match="closed"):
                readiness.drain()
        finally:
            readiness.close()


def _watch_then_die(name: str, ready: object) -> None:
    with Fleet.join(name, CAPACITY) as fleet:
        Readiness(channel(open_region(fleet)), fleet.node, "test-dies")
        ready.set()  # type: ignore[attr-defined]
        os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_watchers_socket_is_skipped_then_replaced_by_the_nodes_next_process(
    shm: Shm, context: Context, children: Start
) -> None:
    ready = context.Event()
    child = children(_watch_then_die, shm.name, ready)
    assert ready.wait(30)
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    node = shm.fleet.node + 1  # the lowest free node, which the child held
    path = Path(channel(shm.region).path(node, 0))
    assert path.is_socket()  # left behind by the kill
    publish(shm.region)  # nobody listens there: no error, the bit is taken
    assert shm.region.buf[PARKED + node] == 0
    with Fleet.join(shm.name, CAPACITY) as fleet:
        assert fleet.node == node
        readiness = Readiness(channel(open_region(fleet)), node, "test-next")
        try:
            publish(shm.region)
            assert readable(readiness.fileno(), BOUND)
        finally:
            readiness.close()


def test_a_path_another_user_owns_is_refused(shm: Shm) -> None:
    path = Path(channel(shm.region).path(shm.fleet.node, 0))
    path.touch()
    try:
        os.chown(path, 12345, 12345)
    except PermissionError:
        path.unlink()
        pytest.skip("needs root to plant another user's file")
    try:
        with pytest.raises(AccessDenied, match="uid 12345"):
            watch(shm)
        assert shm.region.buf[PARKED + shm.fleet.node] == 0  # nothing armed
    finally:
        path.unlink()


@pytest.mark.parametrize(
    ("word", "armed", "node"),
    [(2, 64, 0), (SIZE, 64, 0), (-4, 64, 0), (8, SIZE - 4, 0), (8, 64, -1), (8, 64, CAPACITY)],
    ids=["misaligned-word", "word-past-end", "negative-word", "bytes-past-end", "negative-node",
         "node-past-end"],
)  # fmt: skip
def test_bad_offsets_and_nodes_raise_invalid_layout(
    shm: Shm, word: int, armed: int, node: int
) -> None:
    with pytest.raises(InvalidLayout):
        Readiness(Channel(shm.region, word, armed, CAPACITY), node, "test-bad")


def _checks_in_forked_child(readiness: Readiness, region: Region) -> int:
    for call in (readiness.fileno, readiness.drain):
        try:
            call()
        except FleetError as exc:
            if "parent process" not in str(exc):
                return 2
        else:
            return 3
    readiness.close()
    readiness.close()
    publish(region)
    return 0


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # 3.12+: fork with threads
def test_forked_child_refuses_the_parents_readiness_and_leaves_it_working(shm: Shm) -> None:
    readiness = watch(shm)
    try:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _checks_in_forked_child(readiness, shm.region)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert readable(readiness.fileno(), BOUND)  # the child's publish, after its close()
        assert readiness.drain() == 1
    finally:
        readiness.close()
