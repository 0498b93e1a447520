"""Odd arguments for the public surface, and the check that only named errors come out.

The values are what users hand a library by mistake or by malice: ints past the
float range and past the int-to-str digit limit, NaN and infinities, a float or
int subclass whose conversion hooks raise, bools, str subclasses, lone surrogates,
huge strings, released memoryviews, bytearrays, None, negative numbers, and
objects whose ``__index__``, ``__len__``, ``__eq__``, ``__hash__``, ``__bool__``
or ``__repr__`` raise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from hypothesis import strategies as st

from orbitive import OrbitError


class Hostile(RuntimeError):
    """What every hostile hook raises; it must never escape a public call."""


def _raise(*_: object) -> NoReturn:
    raise Hostile("a hostile hook ran")


class RaisingFloat(float):
    """A float whose own conversion hooks raise."""

    __float__ = _raise
    __index__ = _raise
    __int__ = _raise
    __repr__ = _raise


class RaisingInt(int):
    """An int whose own conversion and comparison hooks raise."""

    __index__ = _raise
    __int__ = _raise
    __float__ = _raise
    __eq__ = _raise
    __lt__ = _raise
    __le__ = _raise
    __gt__ = _raise
    __ge__ = _raise
    __hash__ = _raise
    __repr__ = _raise


class RaisingStr(str):
    """A str whose own methods raise (encode, len, comparisons, slicing)."""

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        raise Hostile("a hostile encode ran")

    __len__ = _raise
    __eq__ = _raise
    __hash__ = _raise
    __getitem__ = _raise
    __contains__ = _raise
    __repr__ = _raise


class RaisingBytes(bytes):
    """A bytes whose own methods raise."""

    __bytes__ = _raise
    __len__ = _raise
    __eq__ = _raise
    __hash__ = _raise
    __add__ = _raise
    __radd__ = _raise
    __getitem__ = _raise
    __repr__ = _raise


class HostileObject:
    """An object every hook of which raises."""

    __index__ = _raise
    __int__ = _raise
    __float__ = _raise
    __len__ = _raise
    __eq__ = _raise
    __lt__ = _raise
    __hash__ = _raise
    __bool__ = _raise
    __repr__ = _raise
    __str__ = _raise
    __bytes__ = _raise
    __iter__ = _raise
    __call__ = _raise

    def __getattr__(self, name: str) -> NoReturn:
        raise Hostile(f"attribute {name}")


def view_of(data: bytes) -> memoryview:
    """A live memoryview of ``data``."""
    return memoryview(data)


def released_view() -> memoryview:
    """A memoryview that was released: any read raises ValueError."""
    view = memoryview(b"released bytes")
    view.release()
    return view


#: Ints past the float range, past 64 bits, and past the 4300-digit int-to-str limit.
HUGE_INTS = [10**400, -(10**400), 10**5000, 2**64, 2**128, 2**1024, -(2**63) - 1]


def _huge(index: int) -> int:
    return HUGE_INTS[index]


SURROGATES = ["\ud800", "a\udfffb", "\udc80"]

#: Numbers a duration or a count might be: odd and ordinary.
numbers: st.SearchStrategy[object] = st.one_of(
    st.sampled_from(range(len(HUGE_INTS))).map(_huge),  # a strategy repr must not show them
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 0.0, -0.0, 1e-12, 5e-324, 1e9, 1e9 + 1, True, False]),
    st.builds(RaisingFloat, st.floats(allow_nan=True)),
    st.builds(RaisingInt, st.integers(min_value=-(2**70), max_value=2**70)),
)

#: Texts a name, owner or key part might be: odd and ordinary.
texts: st.SearchStrategy[object] = st.one_of(
    st.text(max_size=8),
    st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3),
    st.sampled_from(SURROGATES),
    st.sampled_from(["", "x" * 300, "x" * 65536, "a\x00b", "jobs/nightly"]),
    st.builds(RaisingStr, st.text(max_size=4)),
)

#: Byte strings and bytes-likes: odd and ordinary.
blobs: st.SearchStrategy[object] = st.one_of(
    st.binary(max_size=24),
    st.builds(bytearray, st.binary(max_size=8)),
    st.binary(max_size=8).map(view_of),
    st.builds(RaisingBytes, st.binary(max_size=8)),
    st.builds(released_view),
    st.sampled_from([b"", b"x" * 65536]),
)

#: Everything else a caller may pass by mistake.
others: st.SearchStrategy[object] = st.one_of(
    st.none(),
    st.builds(HostileObject),
    st.sampled_from([object(), [], {}, (), 1j, int, float, str]),
)

#: Any odd value at all.
odd: st.SearchStrategy[object] = st.one_of(numbers, texts, blobs, others)


def call(
    function: Callable[..., object],
    *args: Any,
    allowed: tuple[type[OrbitError], ...],
    **kwargs: Any,
) -> tuple[object, OrbitError | None]:
    """Call ``function``; returns (result, None), or (None, error) for a named error.

    Any other exception fails the test, and so does a named error that is not one
    of ``allowed`` (the classes the entry point documents).
    """
    try:
        return function(*args, **kwargs), None
    except OrbitError as error:
        assert isinstance(error, allowed), f"{type(error).__name__} is not documented: {error}"
        return None, error
