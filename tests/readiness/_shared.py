"""Layout and child-process bodies shared by the readiness tests (importable by spawn)."""

from __future__ import annotations

import itertools
import mmap
import os
import struct
import time
from dataclasses import dataclass
from typing import Final, Protocol

from orbitive import Fleet
from orbitive._core._errors import LayoutMismatch
from orbitive._core._readiness import BACKENDS, Channel
from orbitive._core._region import Region

#: A test region: magic @0, the u32 word @8, one parked (or armed) byte per node @64.
KIND: Final = 201
SIZE: Final = 4096
CAPACITY: Final = 8
WORD: Final = 8
PARKED: Final = 64
_MAGIC: Final = b"rdytest1"
_U32: Final = struct.Struct("<I")
_names = itertools.count()


class Flag(Protocol):
    def set(self) -> None: ...
    def wait(self, timeout: float | None = None) -> bool: ...


def unique_fleet_name() -> str:
    return f"rdy{os.getpid()}-{next(_names)}"


def init(buf: mmap.mmap) -> None:
    buf[0:8] = _MAGIC


def validate(buf: mmap.mmap) -> None:
    if len(buf) != SIZE or buf[0:8] != _MAGIC:
        raise LayoutMismatch("readiness test region has another layout")


def open_region(fleet: Fleet) -> Region:
    return fleet.region(KIND, SIZE, init, validate)


def read_word(buf: mmap.mmap) -> int:
    value: int = _U32.unpack_from(buf, WORD)[0]
    return value


def channel(region: Region) -> Channel:
    """The test region's readiness channel: the word @8, armed bytes @64."""
    return Channel(region, WORD, PARKED, CAPACITY)


def publish(region: Region, backend_name: str, count: int = 1) -> None:
    """``count`` word bumps of ``backend_name``, each inside the region's critical section."""
    for _ in range(count):
        region.acquire()
        try:
            BACKENDS[backend_name].bump(region.buf, WORD, PARKED, CAPACITY)
        finally:
            region.release()


def signal(region: Region, count: int = 1) -> None:
    """``count`` publishes on the region's channel, each inside its critical section."""
    watched = channel(region)
    for _ in range(count):
        region.acquire()
        try:
            watched.bump()
        finally:
            region.release()


@dataclass(frozen=True)
class Job:
    """What a publisher process does: ``count`` bumps, ``delay`` seconds after go.

    ``backend_name`` None publishes on the readiness channel (:func:`signal`).
    """

    fleet_name: str
    backend_name: str | None
    count: int = 1
    delay: float = 0.0


def child_publish(job: Job, ready: Flag, go: Flag) -> None:
    """Body of a publisher process: join, attach, report ready, wait for go, bump."""
    with Fleet.join(job.fleet_name, CAPACITY) as fleet:
        region = open_region(fleet)
        ready.set()
        if not go.wait(30):
            raise SystemExit("the parent never said go")
        time.sleep(job.delay)
        if job.backend_name is None:
            signal(region, job.count)
        else:
            publish(region, job.backend_name, job.count)
