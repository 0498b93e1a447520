"""Bytes-like arguments read as the exact bytes they hold, whatever their own hooks do.

Shared by the lock keys and owners and the pool keys: each caller raises its own
named error when :func:`exact_bytes` finds no bytes.
"""

from __future__ import annotations

from typing import cast


def exact_bytes(value: object) -> bytes | None:
    """The bytes a ``bytes``, ``bytearray`` or ``memoryview`` (or a subclass) holds.

    Read through the buffer protocol, so a subclass's ``__bytes__``, ``__len__``
    or ``__add__`` is never called.

    Returns:
        Exact ``bytes``; None for any other type, and for a buffer that cannot be
        read (a released memoryview, say).
    """
    if type(value) is bytes:
        return value
    if not issubclass(type(value), (bytes, bytearray, memoryview)):  # not isinstance: __class__
        return None
    try:
        with memoryview(cast(bytes, value)) as view:
            return view.tobytes()
    except Exception:  # released, or a buffer hook that raises: no bytes to read
        return None
