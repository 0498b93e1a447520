"""Reading the fields of a little-endian ``struct`` layout, for the layout checks."""

from __future__ import annotations

import struct


def fields(layout: struct.Struct | str) -> list[tuple[int, int]]:
    """``(offset, size)`` of every field of a little-endian format, pad bytes left out."""
    codes = (layout if isinstance(layout, str) else layout.format).lstrip("<")
    found, offset, count = [], 0, ""
    for code in codes:
        if code.isdigit():
            count += code
            continue
        size = struct.calcsize(f"<{count}{code}")
        if code != "x":
            found.append((offset, size))
        offset += size
        count = ""
    return found
