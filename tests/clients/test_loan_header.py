"""The loan header a borrower's router sends before a transaction: round trip, and every
damage refused or waited for, never read as another header."""

from __future__ import annotations

import contextlib

import pytest

from orbitive.clients._loan_header import ALWAYS_CHECK, PINNED, SIZE, LoanHeader, decode
from orbitive.pool import MalformedError

HEADER = LoanHeader(
    PINNED | ALWAYS_CHECK,
    client=7,
    lease_ms=300_000,
    settings=(
        (b"TimeZone", b"Europe/Paris"),
        (b"application_name", b""),
        (b"DateStyle", b"ISO, MDY"),
    ),
)


def test_a_header_decodes_to_itself_and_says_how_long_it_was() -> None:
    data = HEADER.encode() + b"Q\x00\x00\x00\x05x"  # the first message follows
    assert decode(data) == (HEADER, len(data) - 6)
    empty = LoanHeader(0, client=0, lease_ms=1, settings=())
    assert decode(empty.encode()) == (empty, SIZE)


def test_every_prefix_of_a_header_is_incomplete_not_malformed() -> None:
    data = HEADER.encode()
    for end in range(len(data)):
        assert decode(data[:end]) is None


def test_every_damaged_byte_is_refused_or_waited_for_never_misread() -> None:
    data = HEADER.encode()
    for index in range(len(data)):
        for flip in (0x01, 0x80, 0xFF):
            damaged = bytearray(data)
            damaged[index] ^= flip
            with contextlib.suppress(MalformedError):
                assert decode(bytes(damaged)) is None  # a length grew: more bytes awaited


@pytest.mark.parametrize(
    "header",
    [
        HEADER._replace(flags=4),
        HEADER._replace(lease_ms=0),
        HEADER._replace(lease_ms=1 << 32),
        HEADER._replace(client=-1),
        HEADER._replace(settings=((b"Time Zone", b"UTC"),)),
        HEADER._replace(settings=((b"", b"UTC"),)),
        HEADER._replace(settings=((b"x" * 64, b"UTC"),)),
        HEADER._replace(settings=((b"TimeZone", b"x" * 4097),)),
        HEADER._replace(settings=((b"a", b"b"),) * 65),
    ],
    ids=[
        "flag",
        "no lease",
        "lease of 2^32",
        "client",
        "space",
        "empty name",
        "long name",
        "long value",
        "65 settings",
    ],
)
def test_a_header_outside_the_rules_is_not_encoded(header: LoanHeader) -> None:
    with pytest.raises(MalformedError):
        header.encode()


def test_a_stream_that_is_not_a_loan_is_refused_at_its_first_byte() -> None:
    with pytest.raises(MalformedError, match="magic"):
        decode(b"GET / HTTP/1.1\r\n")
    with pytest.raises(MalformedError, match="magic"):
        decode(b"X")
