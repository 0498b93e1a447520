"""docs/format.md states the layout constants the code uses."""

from __future__ import annotations

from orbitive._core import _fleet, _robust, _section
from orbitive.lock import LockLayout, _events, _layout, _ring

from ._format_doc import section


def test_lock_state_section_matches_layout_constants() -> None:
    text = section(f"## Lock state table — kind {_layout.DEFAULT_STATE_KIND}, state version")
    layout = LockLayout()
    assert f"state version {_layout.STATE_VERSION}" in text
    assert f"`0x{_layout.STATE_MAGIC:08X}`" in text
    assert f"| 6 | 2 | header_size | {_layout.HEADER_SIZE} |" in text
    assert f"(default {layout.slot_size})" in text
    assert f"(default {layout.payload_max})" in text
    assert f"round_up({_layout.SLOT_HEADER_SIZE} + payload_max, 64)" in text
    assert f"| {_layout.COUNTERS_OFFSET} | 8 | last_token |" in text
    assert f"| {_layout.CONFLICTS_OFFSET} | {_layout.CONFLICTS.size} | conflicts |" in text
    end = _layout.CONFLICTS_OFFSET + _layout.CONFLICTS.size
    assert f"| {end} | {_layout.HEADER_SIZE - end} | reserved | zero |" in text
    assert f"| {_layout.MAX_PROBE_OFFSET} | {_layout.MAX_PROBE.size} | max_probe |" in text
    assert f"| 4 | 2 | version | {_layout.STATE_VERSION} |" in text
    assert f"| {_layout.SLOT_HEADER_SIZE} | … | payload |" in text
    assert _layout.SLOT.size == _layout.SLOT_HEADER_SIZE


def test_ring_section_matches_ring_constants() -> None:
    text = section(f"## Transition ring — kind {_layout.DEFAULT_EVENT_KIND}, ring version")
    assert f"ring version {_ring.RING_VERSION}" in text
    assert f"`0x{_ring.RING_MAGIC:08X}`" in text
    assert f"round_up({_ring.SLOT_HEADER_SIZE} + frame_bytes, 64)" in text
    assert f"| {_ring.SLOT_HEADER_SIZE} | … | payload |" in text
    assert f"(default {LockLayout().ring_capacity})" in text


def test_event_payload_section_matches_event_constants() -> None:
    text = section(f"## Transition ring — kind {_layout.DEFAULT_EVENT_KIND}")
    assert (
        f"event version {_events.EVENT_VERSION} ({_events.EVENT_HEADER.size}-byte header)" in text
    )
    assert f"`0x{_events.EVENT_MAGIC:08X}`" in text
    assert _events.EVENT_HEADER.size == _layout.EVENT_HEADER_SIZE


def test_section_block_and_membership_sections_match_their_constants() -> None:
    text = section(f"## Section block — version {_section.BLOCK_VERSION}")
    assert f"`0x{_section.BLOCK_MAGIC:08X}`" in text
    assert f"{_section.ROBUST_MUTEX} robust mutex, {_section.FLOCK} `flock`" in text
    assert f"| {_robust.SECTION_RECOVERIES_AT} | 8 | recoveries |" in text
    assert f"| {_robust.SECTION_MUTEX_AT} | mutex_bytes | mutex |" in text
    assert f"plus {_robust.SECTION_BYTES}" in text
    members = section(f"## Membership object — version {_fleet.MEMBERS_VERSION}")
    assert f"`0x{_fleet.MEMBERS_MAGIC:08X}`" in members
    assert f"`{_fleet.INCARNATIONS_AT} + 8 * capacity`" in members
