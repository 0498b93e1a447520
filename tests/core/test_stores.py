"""Stores into shared memory are one copy of packed bytes, never ``struct.pack_into``.

``pack_into`` zeroes its whole target before it writes the fields. A process
SIGKILLed between the two left a ring lane's head at 0 (its frames hidden); the
same gap would reset a fence counter, read a slot as EMPTY mid-rewrite or lose
a resource's active count. A failed pack shows the zero pass without a kill.
"""

from __future__ import annotations

import mmap
import struct
import tokenize
from pathlib import Path

import pytest

from orbitive._core._region import store

SOURCE = Path(__file__).resolve().parents[2] / "src" / "orbitive"
PAIR = struct.Struct("<QQ")


def test_pack_into_zeroes_its_target_before_the_fields_so_it_is_not_used() -> None:
    buf = mmap.mmap(-1, mmap.PAGESIZE)
    buf[:16] = b"\xff" * 16
    with pytest.raises(struct.error):
        PAIR.pack_into(buf, 0, 7, "not a number")
    assert buf[:16] == (7).to_bytes(8, "little") + bytes(8)  # the second word went to 0


def test_store_writes_every_field_and_leaves_the_target_untouched_when_packing_fails() -> None:
    buf = mmap.mmap(-1, mmap.PAGESIZE)
    buf[:24] = b"\xff" * 24
    store(buf, 8, PAIR, 1, 2**64 - 1)
    assert buf[:24] == b"\xff" * 8 + (1).to_bytes(8, "little") + b"\xff" * 8
    with pytest.raises(struct.error):
        store(buf, 8, PAIR, 7, "not a number")
    assert buf[:24] == b"\xff" * 8 + (1).to_bytes(8, "little") + b"\xff" * 8


def test_no_module_of_the_library_calls_pack_into() -> None:
    calls = []
    for path in sorted(SOURCE.rglob("*.py")):
        with path.open("rb") as source:
            for token in tokenize.tokenize(source.readline):
                if token.type == tokenize.NAME and token.string == "pack_into":
                    calls.append(f"{path.relative_to(SOURCE)}:{token.start[0]}")
    assert not calls, f"use orbitive._core._region.store instead of pack_into: {calls}"
