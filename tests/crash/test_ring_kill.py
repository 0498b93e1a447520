"""A ring writer killed with SIGKILL mid-stream leaves no torn frame readable."""

from __future__ import annotations

import time

from orbitive import Fleet
from orbitive.lock._ring import Ring, RingGeometry

from .._children import FRAME_HEAD, FRAME_REPEAT, publish_until_killed
from .._processes import Processes

GEOMETRY = RingGeometry(kind=141, lane_count=2, capacity=64, frame_bytes=512)


def test_writer_killed_mid_stream_leaves_only_whole_frames_and_the_lane_reusable(
    processes: Processes, fleet_name: str
) -> None:
    with Fleet.join(fleet_name, 2, node=1) as fleet:
        ring = Ring(fleet, GEOMETRY, FRAME_HEAD)
        try:
            for _ in range(5):
                writer = processes.start(publish_until_killed, fleet_name, 2, GEOMETRY)
                assert writer.recv() == ("ready", 0)
                time.sleep(0.05)
                writer.kill()
                check_whole_frames(ring)
            with Fleet.join(fleet_name, 2, node=0) as successor:
                lane = Ring(successor, GEOMETRY, FRAME_HEAD)
                head = lane.heads()[0]
                assert lane.publish(0, 1, 10**9, (10**9,), b"") == head
        finally:
            ring.region.unlink()


def check_whole_frames(ring: Ring) -> None:
    read = ring.read([0, 0])
    assert read.frames, "the writer published nothing"
    assert read.unavailable <= 1  # at most the one frame it was writing
    for frame in read.frames:
        expected = FRAME_HEAD.pack(frame.ver) * (FRAME_REPEAT + 1)
        assert frame.payload == expected, f"torn frame {frame.counter}"
        assert frame.node == 0
