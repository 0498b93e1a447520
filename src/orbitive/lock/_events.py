"""Transition frames of the lock event ring: encoding, validating decoding and polling.

Frame ``kind``: 1 acquired, 2 renewed, 3 released; frame ``ver``: the
transition's state_revision. Payload (little-endian, version :data:`EVENT_VERSION`)::

      off size field
        0    4 magic           0x4F4C434B "OLCK"
        4    1 version
        5    2 namespace_len   > 0
        7    2 label_len       > 0
        9    2 owner_len       > 0
       11    8 lock_id
       19    8 acquired_at_ms  released: 0
       27    8 expires_at_ms   released: 0; else > acquired_at_ms
       35   .. namespace | label | owner

A frame that breaks any of these rules is counted as malformed, never returned.
"""

from __future__ import annotations

import struct
from typing import Final

from ._ring import Frame, Ring
from ._types import LockEvent, LockKey, LockOwner, LockPoll, Transition

EVENT_MAGIC: Final = 0x4F4C434B
EVENT_VERSION: Final = 1
ACQUIRED: Final = 1
RENEWED: Final = 2
RELEASED: Final = 3
EVENT_HEADER: Final = struct.Struct("<IBHHHQQQ")
_TRANSITIONS: Final[dict[int, Transition]] = {
    ACQUIRED: "acquired",
    RENEWED: "renewed",
    RELEASED: "released",
}


def decode(frame: Frame, payload_max: int) -> LockEvent | None:
    """The event in ``frame``, or None when it is malformed."""
    transition = _TRANSITIONS.get(frame.kind)
    data = frame.payload
    if transition is None or frame.ver == 0 or len(data) < EVENT_HEADER.size:
        return None
    magic, version, ns_len, label_len, owner_len, lock_id, acquired, expires = (
        EVENT_HEADER.unpack_from(data)
    )
    total = ns_len + label_len + owner_len
    if (
        magic != EVENT_MAGIC
        or version != EVENT_VERSION
        or 0 in (ns_len, label_len, owner_len)
        or total > payload_max
        or len(data) != EVENT_HEADER.size + total
    ):
        return None
    if transition == "released":
        if acquired or expires:
            return None
    elif not 0 < acquired < expires:
        return None
    body = data[EVENT_HEADER.size :]
    return LockEvent(
        transition=transition,
        key=LockKey(body[:ns_len], body[ns_len : ns_len + label_len]),
        owner=LockOwner(body[ns_len + label_len :]),
        lock_id=lock_id,
        state_revision=frame.ver,
        expires_at=None if transition == "released" else expires / 1000.0,
        node=frame.node,
        counter=frame.counter,
    )


def poll(ring: Ring, cursors: list[int], payload_max: int) -> LockPoll:
    """The events published past ``cursors`` (advanced), sorted by state_revision."""
    read = ring.read(cursors)
    events = []
    malformed = 0
    for frame in read.frames:
        event = decode(frame, payload_max)
        if event is None:
            malformed += 1
        else:
            events.append(event)
    events.sort(key=lambda event: event.state_revision)
    return LockPoll(tuple(events), read.overwritten, read.unavailable, malformed)
