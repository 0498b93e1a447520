"""The rate-limit table's bytes: its geometry (from the ``shm://`` URL), header and areas.

One SHM object per fleet, ``orbit-{fleet}-249-{uid}`` (:data:`RATE_KIND`), laid out
as docs/format.md's "Rate-limit table" says (little-endian)::

    header (64 bytes)
    0    4   magic          b"ORLT"
    4    2   version        LAYOUT_VERSION
    6    2   header_size    64
    8    4   capacity       counter entries
    12   4   windows        moving-window slots
    16   4   window         timestamps per moving-window slot
    20   4   probe          neighbourhood: slots a key may sit past its home, plus one
    24   8   total_size     bytes of the layout (the section block follows)
    60   4   checksum       CRC-32 of bytes 0..60

    journal (64 bytes, at 64)
    64   8   armed          0: clean; else offset (low 32 bits) | length << 32 of the bytes saved
    72   8   rollbacks      journals rolled back (a process died inside an update)
    80   16  reserved
    96   32  saved          the old bytes of the area being changed

    entries (capacity x 32 bytes, at 128)
    0    16  digest         BLAKE2b-128 of the key (person b"orbit-counter"); all zero: EMPTY
    16   8   expires_at     epoch seconds (float64); dead when not above now
    24   8   value          the counter (int64, >= 0)

    window slots (windows x (32 + 8 x window) bytes, after the entries)
    0    16  digest         BLAKE2b-128 of the key (person b"orbit-window"); all zero: EMPTY
    16   8   expires_at     epoch seconds (float64): the newest timestamp's expiry
    24   4   head           where the next timestamp goes, 0..window-1
    28   4   count          timestamps held, 0..window
    32   ..  stamps         window float64 epoch seconds, a ring

This module never imports ``limits``: ``orbit`` reads the kind number from here.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from dataclasses import dataclass
from typing import Final
from urllib.parse import parse_qsl, urlsplit

from .._core._errors import InvalidName, InvalidRateStorageUrl, LayoutMismatch
from .._core._fleet import check_fleet_name
from .._core._region import Init, Validate

#: The rate-limit table's SHM kind.
RATE_KIND: Final = 249
#: Bumped whenever any offset or meaning below changes.
LAYOUT_VERSION: Final = 1
MAGIC: Final = b"ORLT"
HEADER_SIZE: Final = 64
HEADER: Final = struct.Struct("<4sHHIIIIQ28xI")
HEADER_CHECKED: Final = 60
#: The journal: armed word, rollbacks counter, saved bytes.
JOURNAL_AT: Final = 64
ROLLBACKS_AT: Final = 72
SAVED_AT: Final = 96
SAVED_MAX: Final = 32
ENTRIES_AT: Final = 128
ENTRY_SIZE: Final = 32
#: digest low, digest high, expires_at, value.
ENTRY: Final = struct.Struct("<QQdq")
#: digest low, digest high, expires_at, head, count.
SLOT_HEAD: Final = struct.Struct("<QQdII")
SLOT_HEAD_SIZE: Final = 32
U64: Final = struct.Struct("<Q")
F64: Final = struct.Struct("<d")
#: head | count << 32, one aligned 8-byte store.
HEAD_COUNT: Final = struct.Struct("<II")

CAPACITY_DEFAULT: Final = 1024
WINDOW_DEFAULT: Final = 128
#: Largest capacity and window slot count.
CAPACITY_MAX: Final = 1 << 20
WINDOWS_MAX: Final = 1 << 16
#: Most timestamps one moving-window slot holds (the largest moving-window limit).
WINDOW_MAX: Final = 65536
#: Largest layout, in bytes (1 GiB).
TOTAL_MAX: Final = 1 << 30
#: Slots a key may sit past its home (the neighbourhood probed), at most.
PROBE: Final = 64
OPTIONS: Final = ("capacity", "windows", "window")


def _round_up(value: int, to: int) -> int:
    return (value + to - 1) // to * to


@dataclass(frozen=True, slots=True)
class Geometry:
    """The sizes of one rate-limit table (from its URL).

    Attributes:
        capacity: counter entries (fixed-window and sliding-window counters).
        windows: moving-window slots (one per moving-window key).
        window: timestamps per moving-window slot: the largest moving-window limit.
    """

    capacity: int = CAPACITY_DEFAULT
    windows: int = CAPACITY_DEFAULT // 4
    window: int = WINDOW_DEFAULT

    @property
    def probe(self) -> int:
        """Entries a counter key's probe visits at most (its neighbourhood)."""
        return min(PROBE, self.capacity)

    @property
    def window_probe(self) -> int:
        """Window slots a moving-window key's probe visits at most."""
        return min(PROBE, self.windows)

    @property
    def slot_size(self) -> int:
        """Bytes of one moving-window slot."""
        return SLOT_HEAD_SIZE + 8 * self.window

    @property
    def windows_at(self) -> int:
        """Offset of the first moving-window slot."""
        return _round_up(ENTRIES_AT + ENTRY_SIZE * self.capacity, 64)

    @property
    def size(self) -> int:
        """Bytes of the layout (the object adds padding to a page and its section block)."""
        return self.windows_at + self.windows * self.slot_size


def parse_url(url: object) -> tuple[str, Geometry]:
    """The fleet and geometry of ``shm://FLEET[?capacity=N&windows=N&window=N]``.

    Also accepts the ``async+shm://`` form. ``windows`` defaults to ``capacity // 4``
    (at least 1).

    Raises:
        InvalidRateStorageUrl: not a str, another scheme, a path, user, port or
            fragment, a bad fleet name, an unknown or repeated option, or a size that is
            not an integer in its range (capacity 1..1048576, windows 1..65536, window
            1..65536, all of it at most 1 GiB).
    """
    if not isinstance(url, str):
        raise InvalidRateStorageUrl(
            f"rate-limit storage URL must be a str, not {type(url).__name__}"
        )
    form = "shm://FLEET[?capacity=N&windows=N&window=N]"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise InvalidRateStorageUrl(
            f"rate-limit storage URL {url!r}: {error}; expected {form}"
        ) from None
    if parts.scheme not in ("shm", "async+shm"):
        raise InvalidRateStorageUrl(f"rate-limit storage URL {url!r}: expected {form}")
    if parts.path not in ("", "/") or parts.fragment or parts.username or parts.password or port:
        raise InvalidRateStorageUrl(
            f"rate-limit storage URL {url!r}: only a fleet name and options go in it; "
            f"expected {form}"
        )
    try:
        fleet = check_fleet_name(parts.hostname or "")
    except InvalidName as error:
        raise InvalidRateStorageUrl(f"rate-limit storage URL {url!r}: {error.message}") from None
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise InvalidRateStorageUrl(
            f"rate-limit storage URL {url!r}: options must be NAME=VALUE joined by '&'; "
            f"expected {form}"
        ) from None
    sizes: dict[str, int] = {}
    for name, value in pairs:
        if name not in OPTIONS:
            raise InvalidRateStorageUrl(
                f"rate-limit storage URL {url!r}: unknown option {name!r}; the options are "
                f"{', '.join(OPTIONS)}"
            )
        if name in sizes:
            raise InvalidRateStorageUrl(
                f"rate-limit storage URL {url!r}: option {name!r} given twice"
            )
        sizes[name] = _size(url, name, value)
    capacity = sizes.get("capacity", CAPACITY_DEFAULT)
    geometry = Geometry(
        capacity=capacity,
        windows=sizes.get("windows", max(1, capacity // 4)),
        window=sizes.get("window", WINDOW_DEFAULT),
    )
    if geometry.size > TOTAL_MAX:
        raise InvalidRateStorageUrl(
            f"rate-limit storage URL {url!r}: the table would take {geometry.size:,} bytes, "
            f"more than {TOTAL_MAX:,}; lower windows or window"
        )
    return fleet, geometry


_RANGES: Final = {"capacity": CAPACITY_MAX, "windows": WINDOWS_MAX, "window": WINDOW_MAX}


def _size(url: str, name: str, value: str) -> int:
    top = _RANGES[name]
    text = value.strip()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= top:
        raise InvalidRateStorageUrl(
            f"rate-limit storage URL {url!r}: option {name}={value!r} must be an integer "
            f"from 1 to {top}"
        )
    return int(text)


def header(geometry: Geometry) -> bytes:
    """The 64 header bytes of a table of ``geometry``, checksum included."""
    raw = HEADER.pack(MAGIC, LAYOUT_VERSION, HEADER_SIZE, geometry.capacity, geometry.windows,
                      geometry.window, PROBE, geometry.size, 0)  # fmt: skip
    return raw[:HEADER_CHECKED] + struct.pack("<I", zlib.crc32(raw[:HEADER_CHECKED]))


def init(geometry: Geometry) -> Init:
    """The ``init`` of a new table: its header (the rest of a new object is zero)."""

    def write(buf: mmap.mmap) -> None:
        buf[:HEADER_SIZE] = header(geometry)

    return write


def validator(fleet: str, geometry: Geometry) -> Validate:
    """The ``validate`` of an existing table: every header field and the checksum."""

    def validate(buf: mmap.mmap) -> None:
        check_header(bytes(buf[:HEADER_SIZE]), fleet, geometry)

    return validate


def check_header(raw: bytes, fleet: str, geometry: Geometry) -> None:
    """Raise :class:`LayoutMismatch` unless ``raw`` is the header of ``geometry``.

    Raises:
        LayoutMismatch: another magic, version, geometry (the message names both), or a
            checksum that does not match its bytes.
    """
    expected = header(geometry)
    if raw == expected:
        return
    found = HEADER.unpack(raw)
    if zlib.crc32(raw[:HEADER_CHECKED]) != found[-1] or found[:3] != HEADER.unpack(expected)[:3]:
        raise LayoutMismatch(
            f"rate-limit table of fleet {fleet!r} (kind {RATE_KIND}) has a header this "
            "release does not read (another version, or corrupt bytes); stop its users and "
            f"remove it: orbit clear {fleet} --kind {RATE_KIND}",
            fleet=fleet,
            kind=RATE_KIND,
        )
    raise LayoutMismatch(
        f"rate-limit table of fleet {fleet!r} was made with capacity={found[3]}, "
        f"windows={found[4]}, window={found[5]}; this URL asks for capacity="
        f"{geometry.capacity}, windows={geometry.windows}, window={geometry.window}: give "
        "every process the same options (or clear the table while nobody uses it)",
        fleet=fleet,
        kind=RATE_KIND,
    )
