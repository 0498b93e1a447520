"""The transition ring: seqlock frames, per-node lanes, and loss accounting."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest

from orbitive import Fleet
from orbitive._core._errors import InvalidLayout, LayoutMismatch
from orbitive.lock._ring import LANE_HEAD_SIZE, Ring, RingGeometry

from ..conftest import MakeFleet

GEOMETRY = RingGeometry(kind=140, lane_count=4, capacity=8, frame_bytes=64)
HEAD = struct.Struct("<I")


@pytest.fixture
def ring(make_fleet: MakeFleet) -> Iterator[Ring]:
    opened = Ring(make_fleet(4), GEOMETRY, HEAD)
    yield opened
    opened.close()
    opened.region.unlink()


def publish(ring: Ring, node: int, ver: int) -> int:
    return ring.publish(node, 7, ver, (ver,), bytes([ver % 256]) * 10)


def slot_offset(ring: Ring, lane: int, counter: int) -> int:
    g = ring.geometry
    return g.slots_offset + (lane * g.capacity + counter % g.capacity) * g.stride


def test_frames_come_back_per_lane_with_their_fields(ring: Ring) -> None:
    assert publish(ring, 0, 1) == 0
    assert publish(ring, 2, 2) == 0
    assert publish(ring, 0, 3) == 1
    cursors = [0] * 4
    read = ring.read(cursors)
    assert [(f.node, f.counter, f.ver, f.kind) for f in read.frames] == [
        (0, 0, 1, 7),
        (0, 1, 3, 7),
        (2, 0, 2, 7),
    ]
    assert read.frames[0].payload == HEAD.pack(1) + b"\x01" * 10
    assert cursors == [2, 0, 1, 0] == ring.heads()
    assert ring.read(cursors).frames == []


def test_a_reader_that_fell_behind_counts_overwritten_frames(ring: Ring) -> None:
    for ver in range(1, 21):
        publish(ring, 1, ver)
    read = ring.read([0] * 4)
    assert read.overwritten == 12
    assert [frame.ver for frame in read.frames] == list(range(13, 21))


def test_a_frame_being_written_is_unavailable_never_torn(ring: Ring) -> None:
    publish(ring, 0, 1)
    publish(ring, 0, 2)
    offset = slot_offset(ring, 0, 1)
    ring.buf[offset : offset + 8] = (2 * 1 + 1).to_bytes(8, "little")  # seq odd: mid-write
    read = ring.read([0] * 4)
    assert [frame.ver for frame in read.frames] == [1]
    assert read.unavailable == 1


def test_a_writer_killed_mid_frame_leaves_the_head_and_the_next_writer_reuses_it(
    ring: Ring,
) -> None:
    publish(ring, 3, 1)
    offset = slot_offset(ring, 3, 1)
    ring.buf[offset : offset + 8] = (2 * 1 + 1).to_bytes(8, "little")  # killed after seq := 2c+1
    assert ring.heads()[3] == 1
    assert [f.ver for f in ring.read([0] * 4).frames] == [1]
    assert publish(ring, 3, 2) == 1
    assert [f.ver for f in ring.read([0] * 4).frames] == [1, 2]


def test_a_corrupt_lane_head_refuses_to_publish(ring: Ring) -> None:
    head_at = ring.geometry.heads_offset + 2 * LANE_HEAD_SIZE
    ring.buf[head_at : head_at + 8] = (1 << 63).to_bytes(8, "little")
    with pytest.raises(LayoutMismatch):
        publish(ring, 2, 1)
    publish(ring, 1, 1)  # other lanes are unaffected
    read = ring.read([0] * 4)  # a huge head costs at most one ring of reads
    assert read.overwritten > 0
    assert len(read.frames) <= 8 + 1


def test_a_frame_header_larger_than_frame_bytes_is_invalid_layout(fleet_name: str) -> None:
    with Fleet.join(fleet_name, 4) as fleet, pytest.raises(InvalidLayout):
        Ring(fleet, GEOMETRY, struct.Struct("<65s"))


def test_a_frame_filling_frame_bytes_comes_back_whole(ring: Ring) -> None:
    ring.publish(0, 1, 1, (1,), b"x" * 60)
    assert ring.read([0] * 4).frames[0].payload == HEAD.pack(1) + b"x" * 60


def test_reset_zeroes_every_lane(ring: Ring) -> None:
    for node in range(4):
        publish(ring, node, node + 1)
    ring.reset()
    assert ring.heads() == [0, 0, 0, 0]
    assert ring.read([0] * 4).frames == []


def test_attaching_with_another_geometry_is_layout_mismatch(fleet_name: str) -> None:
    with Fleet.join(fleet_name, 4) as fleet:
        ring = Ring(fleet, GEOMETRY, HEAD)
        try:
            with Fleet.join(fleet_name, 4) as other:
                for changed in (
                    RingGeometry(kind=140, lane_count=4, capacity=16, frame_bytes=64),
                    RingGeometry(kind=140, lane_count=4, capacity=8, frame_bytes=128),
                ):
                    with pytest.raises(LayoutMismatch):
                        Ring(other, changed, HEAD)
        finally:
            ring.region.unlink()


@pytest.mark.parametrize(
    ("capacity", "frame_bytes"), [(0, 64), (3, 64), (1 << 21, 64), (8, -1), (8, (1 << 20) + 1)]
)
def test_invalid_ring_geometry_is_invalid_layout(capacity: int, frame_bytes: int) -> None:
    with pytest.raises(InvalidLayout):
        RingGeometry(kind=1, lane_count=1, capacity=capacity, frame_bytes=frame_bytes)
