"""The contract's guards against the documented rules, character by character.

The guards take a fast path for the common case (ASCII names and owners, a float
ttl in range); these tests pin that every input gets the verdict of the rule as
the README states it, whichever path decides.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

from orbitive._core._errors import InvalidLockName, InvalidLockOwner, InvalidLockTtl
from orbitive.store._guards import TTL_MIN_S, check_name, check_owner, check_store_ttl

#: Every ASCII and Latin-1 character, plus surrogates and a few beyond.
CHARACTERS = [chr(code) for code in range(0x100)] + ["\u2028", "\ud800", "\udfff", "\U0001f389"]


def name_is_valid(name: str) -> bool:
    """The README's name rule, written out directly."""
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        return False
    controls = any(code <= 0x1F or 0x7F <= code <= 0x9F for code in map(ord, name))
    return 0 < size <= 255 and not controls


def owner_is_valid(owner: str) -> bool:
    """The README's owner rule, written out directly."""
    try:
        size = len(owner.encode())
    except UnicodeEncodeError:
        return False
    return 0 < size <= 255 and "\x00" not in owner


def accepts(check: Callable[[object], str], value: str, refusal: type[Exception]) -> bool:
    """Whether ``check`` returns ``value`` itself rather than raising ``refusal``."""
    try:
        assert check(value) is value
    except refusal:
        return False
    return True


@pytest.mark.parametrize("length", [1, 2, 254, 255])
def test_every_character_gets_the_name_rules_verdict(length: int) -> None:
    for char in CHARACTERS:
        name = ("a" * (length - 1) + char) if length > 1 else char
        assert accepts(check_name, name, InvalidLockName) is name_is_valid(name), repr(name)


@pytest.mark.parametrize("length", [1, 2, 254, 255])
def test_every_character_gets_the_owner_rules_verdict(length: int) -> None:
    for char in CHARACTERS:
        owner = ("o" * (length - 1) + char) if length > 1 else char
        assert accepts(check_owner, owner, InvalidLockOwner) is owner_is_valid(owner), repr(owner)


def test_str_subclasses_are_refused_as_names_and_owners() -> None:
    class Text(str):
        pass

    with pytest.raises(InvalidLockName):
        check_name(Text("jobs"))
    with pytest.raises(InvalidLockOwner):
        check_owner(Text("worker"))


@pytest.mark.parametrize(
    ("ttl", "expected"),
    [
        (30.0, 30.0),
        (30, 30.0),
        (TTL_MIN_S, TTL_MIN_S),
        (math.nextafter(TTL_MIN_S, 0.0), TTL_MIN_S),
        (5e-324, TTL_MIN_S),
        (1e9, 1e9),
    ],
)
def test_a_valid_ttl_is_a_float_of_at_least_one_millisecond(ttl: float, expected: float) -> None:
    value = check_store_ttl(ttl)
    assert type(value) is float and value == expected


@pytest.mark.parametrize("ttl", [0.0, -0.0, -1.0, math.nextafter(1e9, math.inf), math.nan, True])
def test_an_invalid_ttl_is_refused(ttl: float) -> None:
    with pytest.raises(InvalidLockTtl):
        check_store_ttl(ttl)
