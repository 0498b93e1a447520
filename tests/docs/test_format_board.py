"""docs/format.md states the budget board's layout as the code has it."""

from __future__ import annotations

from orbitive.clients import _board

from .._structs import fields
from ._format_doc import section


def test_board_header_and_record_rows_match_the_structs() -> None:
    text = section(f"## Budget board — kind {_board.BOARD_KIND}, layout version")
    assert f"layout version {_board.LAYOUT_VERSION}" in text
    assert f"magic `{_board.MAGIC.decode()}`" in text
    assert f"version u16 @4 ({_board.LAYOUT_VERSION})" in text
    assert f"records u32 @8 ({_board.RECORDS})" in text
    assert f"record_size u32 @12 ({_board.RECORD_SIZE})" in text
    assert f"{_board.HEADER_SIZE} + {_board.RECORDS} x {_board.RECORD_SIZE} bytes" in text
    names = ("state", "total", "budget", "budget", "steward node", "incarnation", "deadline",
             "cap", "held", "lost", "max_live", "min_idle", "blob length", "blob CRC",
             "steward until")  # fmt: skip
    found = fields(_board.HEAD.format)
    assert len(found) == len(names)
    key_lo, key_hi = found[2], found[3]
    assert key_hi[0] == key_lo[0] + 8  # the key's two halves are one 16-byte row
    for (offset, size), name in zip(found, names, strict=True):
        row = (key_lo[0], 16) if name == "budget" else (offset, size)
        assert f"| {row[0]} | {row[1]} | {name} |" in text, name
    assert f"| {_board.RECORD_HEAD} | .. | blob |" in text
