"""docs/format.md states the pool's layout and frame as the code has them."""

from __future__ import annotations

from orbitive.pool import _layout, session
from orbitive.pool._layout import Layout

from .._structs import fields
from ._format_doc import section


def _offsets(fmt: str, names: tuple[str, ...]) -> list[tuple[int, int, str]]:
    """(offset, size, name) of each field of a little-endian struct format."""
    found = fields(fmt)
    assert len(found) == len(names)
    return [(offset, size, name) for (offset, size), name in zip(found, names, strict=True)]


def test_pool_header_rows_match_the_header_struct() -> None:
    text = section(f"## Pool table — kind {_layout.POOL_KIND}, layout version")
    assert f"layout version {_layout.LAYOUT_VERSION}" in text
    assert f"| 4 | 2 | version | {_layout.LAYOUT_VERSION} |" in text
    assert f"| 6 | 2 | header_size | {_layout.HEADER_SIZE} |" in text
    assert f"`{_layout.MAGIC.decode()}`" in text
    names = tuple(n.replace("reserved_tail", "reserved") for n in _layout.HEADER_NAMES)
    for offset, size, name in _offsets(_layout.HEADER.format, names):
        assert f"| {offset} | {size} | {name} |" in text, name


def test_pool_resource_and_key_rows_match_the_constants() -> None:
    text = section("## Pool table")
    hot = ("state", "owner_node", "generation", "owner_incarnation", "key_lo", "key_hi",
           "capacity", "key_index", "active", "fence", "last_reserve_ms", "epoch")  # fmt: skip
    for offset, size, name in _offsets(_layout.RES_HOT.format, hot):
        assert f"| {offset} | {size} | {name} |" in text, name
    assert f"| {_layout.RES_FENCES} | 128 | pending fences |" in text
    assert f"| {_layout.RES_SINCE} | 128 | pending since |" in text
    assert f"| resources | F * L * {_layout.RESOURCE_SIZE} |" in text
    assert f"| {_layout.KEY_CHANGES} | 4 | changes |" in text
    assert f"| {_layout.KEY_PARKED} | F | parked |" in text
    assert f"{_layout.PENDING} x u64" in text
    layout = Layout(247, 3, 8, 16)
    assert layout.key_interest == _layout.KEY_PARKED + 8  # 64 + round_up(F, 8)
    assert layout.key_claims == _layout.KEY_PARKED + 16
    assert layout.key_waiters == layout.key_claims + 16  # claims + round_up(4 * F, 8)
    assert layout.key_wait_since == layout.key_waiters + 16  # waiters + round_up(4 * F, 8)
    assert layout.key_wait_seen == layout.key_wait_since + 16  # since + round_up(4 * F, 8)
    assert layout.key_members == layout.key_wait_seen + 16  # seen + round_up(4 * F, 8)
    for name in ("waiters", "since", "seen"):
        assert f"| 4 * F | {name} |" in text, name
    assert layout.key_waits == layout.key_members + layout.member_bytes
    assert "| waits = members + round_up(ceil(F * L / 8), 8) | 8 | timeouts |" in text
    assert "| waits + 8 | 8 | waits |" in text
    assert "| waits + 16 | 8 | wait_us |" in text
    assert _layout.KEY_WAITS.size == 24 + 8 * len(_layout.WAIT_BOUNDS_US) == 96
    bounds_ms = ", ".join(f"{bound // 1000}" for bound in _layout.WAIT_BOUNDS_US)
    assert f"| waits + 24 | 72 | buckets | 9 x u64: per upper bound ({bounds_ms} ms)" in text
    assert layout.key_limits == layout.key_waits + _layout.KEY_WAITS.size
    assert (
        f"| waits + 96 | {_layout.KEY_LIMITS.size} | limits | max_live, min_idle, max_idle" in text
    )
    assert layout.key_label == layout.key_limits + _layout.LIMITS_SIZE == layout.key_waits + 112
    assert f"| waits + 112 | {_layout.LABEL_SIZE} | label |" in text
    assert f"(at most {_layout.LABEL_MAX})" in text
    assert layout.key_opened == layout.key_label + _layout.LABEL_SIZE == layout.key_waits + 240
    assert "| waits + 240 | F | opened |" in text
    assert layout.key_stride == -(-(layout.key_opened + 8) // 64) * 64  # + round_up(F, 8)


def test_session_frame_rows_match_the_frame_struct() -> None:
    text = section(f"## Pool session frame, version {session.FRAME_VERSION}")
    names = ("magic", "version", "kind", "holder_node", "resource", "fence",
             "holder_incarnation", "epoch", "checksum")  # fmt: skip
    for offset, size, name in _offsets(session.FRAME.format, names):
        assert f"| {offset} | {size} | {name} |" in text, name
    assert f"exactly these {session.FRAME_SIZE} bytes" in text
    assert "| 40 | 4 | reserved | zero |" in text
