"""Readiness: a publish in another process makes this process's descriptor readable."""

from __future__ import annotations

import asyncio
import mmap
import os
import selectors
import threading

import pytest

from orbitive import Fleet
from orbitive._core._errors import FleetError, InvalidLayout
from orbitive._core._readiness import Backend, Readiness
from orbitive._core._region import Region

from ._shared import (
    CAPACITY,
    PARKED,
    SIZE,
    WORD,
    Job,
    child_publish,
    open_region,
    publish,
    read_word,
    unique_fleet_name,
)
from .conftest import Context, Shm, Start

BOUND = 2.0  # seconds: generous, the usual figure is well under a millisecond


def readable(fd: int, timeout: float) -> bool:
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        return bool(selector.select(timeout))


def watch(shm: Shm, backend: Backend) -> Readiness:
    buf, node = shm.region.buf, shm.fleet.node
    return Readiness(buf, WORD, PARKED, node, "test-readiness", lock=shm.region, backend=backend)


def test_child_bump_makes_descriptor_readable_and_drain_clears_it(
    backend: Backend, shm: Shm, context: Context, children: Start
) -> None:
    ready, go = context.Event(), context.Event()
    child = children(child_publish, Job(shm.name, backend.NAME), ready, go)
    assert ready.wait(30)
    readiness = watch(shm, backend)
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


def test_burst_of_bumps_coalesces_into_few_readable_edges(
    backend: Backend, shm: Shm, context: Context, children: Start
) -> None:
    ready, go = context.Event(), context.Event()
    child = children(child_publish, Job(shm.name, backend.NAME, count=5), ready, go)
    assert ready.wait(30)
    start = read_word(shm.region.buf)
    readiness = watch(shm, backend)
    try:
        go.set()
        assert readable(readiness.fileno(), BOUND)
        child.join(30)
        assert child.exitcode == 0
        total = 0
        while readable(readiness.fileno(), 0.1):
            total += readiness.drain()
        assert 1 <= total <= 5
        assert read_word(shm.region.buf) == start + 5
    finally:
        readiness.close()


def test_child_bump_wakes_an_asyncio_reader(
    backend: Backend, shm: Shm, context: Context, children: Start
) -> None:
    ready, go = context.Event(), context.Event()
    child = children(child_publish, Job(shm.name, backend.NAME), ready, go)
    assert ready.wait(30)
    readiness = watch(shm, backend)

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


def test_publisher_thread_over_a_local_fleet(backend: Backend) -> None:
    with Fleet.local(unique_fleet_name(), CAPACITY, node=2) as fleet:
        region = open_region(fleet)
        readiness = Readiness(
            region.buf, WORD, PARKED, fleet.node, "test-local", lock=region, backend=backend
        )
        try:
            threading.Thread(target=publish, args=(region, backend.NAME)).start()
            assert readable(readiness.fileno(), BOUND)
            assert readiness.drain() == 1
        finally:
            readiness.close()


def test_close_is_idempotent_joins_the_driver_and_releases_the_mapping(
    backend: Backend,
) -> None:
    buf = mmap.mmap(-1, SIZE)
    readiness = Readiness(buf, WORD, PARKED, 3, "test-close", backend=backend)
    drivers = [t for t in threading.enumerate() if t.name == "test-close"]
    assert len(drivers) == 1 and drivers[0].daemon
    assert buf[PARKED + 3] == (1 if backend.PARKED else 0)  # without a lock: held for life
    readiness.close()
    readiness.close()
    assert not drivers[0].is_alive()
    assert buf[PARKED + 3] == 0
    with pytest.raises(FleetError, match="closed"):
        readiness.fileno()
    with pytest.raises(FleetError, match="closed"):
        readiness.drain()
    assert "closed" in repr(readiness)
    buf.close()  # raises BufferError if the driver left the mapping exported


def test_driver_error_is_raised_by_drain(backend: Backend) -> None:
    buf = mmap.mmap(-1, SIZE)
    lock = threading.Lock()
    readiness = Readiness(buf, WORD, PARKED, 0, "test-error", lock=lock, backend=backend)
    try:
        with lock:
            backend.bump(buf, WORD, PARKED, CAPACITY)
        assert readable(readiness.fileno(), BOUND)
        buf.close()  # the driver now waits for the drain and has nothing mapped
        assert readiness.drain() == 1
        assert readable(readiness.fileno(), BOUND)
        with pytest.raises(FleetError, match="driver stopped"):
            readiness.drain()
    finally:
        readiness.close()


@pytest.mark.parametrize(
    ("size", "word", "parked", "node"),
    [(64, 2, 8, 0), (64, 64, 8, 0), (64, -4, 8, 0), (64, 0, 60, 4), (64, 0, 8, -1)],
    ids=["misaligned-word", "word-past-end", "negative-word", "byte-past-end", "negative-node"],
)
def test_bad_offsets_raise_invalid_layout(
    backend: Backend, size: int, word: int, parked: int, node: int
) -> None:
    buf = mmap.mmap(-1, size)
    with pytest.raises(InvalidLayout):
        Readiness(buf, word, parked, node, "test-bad", backend=backend)
    buf.close()


def test_non_mmap_buffer_raises_type_error(backend: Backend) -> None:
    with pytest.raises(TypeError, match="mmap"):
        Readiness(bytearray(64), 0, 8, 0, "test-bad", backend=backend)  # type: ignore[arg-type]


def _checks_in_forked_child(readiness: Readiness, region: Region, backend_name: str) -> int:
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
    publish(region, backend_name)
    return 0


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")  # 3.12+: fork with threads
def test_forked_child_refuses_the_parents_readiness_and_leaves_it_working(
    backend: Backend, shm: Shm
) -> None:
    readiness = watch(shm, backend)
    try:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _checks_in_forked_child(readiness, shm.region, backend.NAME)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert readable(readiness.fileno(), BOUND)  # the child's bump, after its close()
        assert readiness.drain() == 1
    finally:
        readiness.close()
