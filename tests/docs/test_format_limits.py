"""docs/format.md states the rate-limit table's layout as the code has it."""

from __future__ import annotations

from orbitive.limits import _layout, _table
from orbitive.limits._layout import Geometry

from .._structs import fields
from ._format_doc import section


def test_rate_limit_table_rows_match_the_structs() -> None:
    text = section(f"## Rate-limit table — kind {_layout.RATE_KIND}, layout version")
    assert f"layout version {_layout.LAYOUT_VERSION}" in text
    assert f"| 0 | 4 | magic | `{_layout.MAGIC.decode()}` |" in text
    assert f"| 4 | 2 | version | {_layout.LAYOUT_VERSION} |" in text
    names = ("magic", "version", "header_size", "capacity", "windows", "window", "probe",
             "total_size", "checksum")  # fmt: skip
    for (offset, size), name in zip(fields(_layout.HEADER), names, strict=True):
        assert f"| {offset} | {size} | {name} |" in text, name
    assert f"| {_layout.JOURNAL_AT} | 8 | armed |" in text
    assert f"| {_layout.ROLLBACKS_AT} | 8 | rollbacks |" in text
    assert f"| {_layout.SAVED_AT} | {_layout.SAVED_MAX} | saved |" in text
    assert f"C x {_layout.ENTRY_SIZE} bytes from offset {_layout.ENTRIES_AT}" in text
    entry = fields(_layout.ENTRY)
    assert entry[1][0] == entry[0][0] + 8  # the digest's two halves are one 16-byte row
    assert f"| {entry[2][0]} | 8 | expires_at |" in text
    assert f"| {entry[3][0]} | 8 | value |" in text
    slot = fields(_layout.SLOT_HEAD)
    assert [f"| {offset} | {size} |" in text for offset, size in slot[2:]] == [True] * 3
    assert f"| {_layout.SLOT_HEAD_SIZE} | 8 x T | stamps |" in text
    assert f"person `{_table._COUNTER.decode()}`" in text
    assert f"person `{_table._WINDOW.decode()}`" in text
    assert f"{Geometry().size:,} by default" in text
    assert f"| 20 | 4 | probe | {_layout.PROBE}:" in text
