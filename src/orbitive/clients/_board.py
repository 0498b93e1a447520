"""Board: a host's hold on its budgets, in the fleet's shared memory.

One SHM object per fleet, ``orbit-{fleet}-248-{uid}`` (:data:`BOARD_KIND`), with
a record per budget the host's pools name. The record is what every process of
the host needs to know about the host's units, and what a new steward needs to
go on renewing them when the old one is gone:

* the **steward**: the node and incarnation of the one process that holds the
  host's units, and until when it has promised to act again (its *stewardship
  lease*): any other process of the host takes over when that life is over (the
  fleet's node lock tells) or the lease has run out (a steward paused by SIGSTOP,
  a debugger, a stalled VM or a C call holding its GIL, whose units would
  otherwise lapse while its own clients stay open);
* the **units**, as the engine granted them (packed by
  :meth:`~._coordinator.Coordinator.pack`), so that any process can renew them;
* the **deadline**: until when every unit is surely held, in ``CLOCK_BOOTTIME``
  nanoseconds (it counts a suspended machine's sleep, which ``CLOCK_MONOTONIC``
  does not): the send time of the renewal that last succeeded, plus the ttl less
  a margin for the rate error of the two clocks;
* the **cap**: the budget's key may hold at most this many live and creating
  clients on the host; at most the units held, lowered first when units are to
  be given back;
* **lost**: set when a renewal found units gone, so that clients beyond the cap
  are severed at once instead of at the deadline.

Every read and write runs in the object's critical section. A creation claim of
the budget's key runs inside it too (:meth:`Board.capped`), around the pool
table's own step, and so does the steward's shrink (:meth:`Board.shrink`): a
claim and a shrink never interleave, so the units left after a shrink always
cover the clients. The lock order is the board's section, then the pool table's;
no step takes them the other way.

Layout (little-endian)::

    header (64 bytes)
    0    4   magic          b"BDGT"
    4    2   version        LAYOUT_VERSION
    6    2   header_size    64
    8    4   records        RECORDS
    12   4   record_size    RECORD_SIZE
    60   4   checksum       CRC-32 of bytes 0..60

    record (RECORD_SIZE bytes each, after the header)
    0    1   state          0 empty, 1 in use
    4    4   total          the budget's total (another one is refused)
    8    16  budget         the budget's pool key (low, high 64 bits)
    24   2   steward node   0xFFFF: none
    32   8   incarnation    the steward's life (0: none)
    40   8   deadline       CLOCK_BOOTTIME ns the units are surely held until (0: none)
    48   4   cap            live + creating clients of the key stay at most this
    52   4   held           units in the blob
    56   1   lost           1: units were found gone; clients beyond the cap are severed
    60   4   max_live       of the pool that opened the record last
    64   4   min_idle       of the pool that opened the record last
    68   4   blob length
    72   4   blob CRC-32
    80   8   steward until  CLOCK_BOOTTIME ns the steward's lease runs to (0: none)
    88   ..  blob           UTF-8 JSON {"host": id, "units": [...], "post": [owner, grant] | null}
"""

from __future__ import annotations

import json
import mmap
import secrets
import socket
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar, final

from .._core._errors import BudgetMismatch, FleetError, LayoutMismatch
from .._core._fleet import Fleet
from .._core._region import Region, object_name, object_size, read_prefix, store
from ..pool import Key
from ._budget import Budget

T = TypeVar("T")

#: The board's SHM kind.
BOARD_KIND: Final = 248
#: Bumped whenever any offset or meaning below changes.
LAYOUT_VERSION: Final = 2
MAGIC: Final = b"BDGT"
HEADER_SIZE: Final = 64
#: Budgets one fleet may use at once.
RECORDS: Final = 8
RECORD_SIZE: Final = 32768
RECORD_HEAD: Final = 88
#: Most units a host holds of one budget (what the blob has room for with Redis grants).
UNITS_MAX: Final = 256
SIZE: Final = HEADER_SIZE + RECORDS * RECORD_SIZE
HEADER: Final = struct.Struct("<4sHHII44xI")
HEAD: Final = struct.Struct("<B3xIQQH6xQQIIB3xIIII4xQ")
HEADER_CHECKED: Final = 60
NO_NODE: Final = 0xFFFF
#: Rate error allowed between the host's clock and the coordinator's (1000 ppm, twice
#: what NTP may slew), and a margin for the coordinator's millisecond rounding, in ns.
RATE_ERROR: Final = 0.001
MARGIN_NS: Final = 10_000_000


def boot_ns() -> int:
    """``CLOCK_BOOTTIME`` in nanoseconds: the host's clock of a deadline."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def deadline_after(sent_ns: int, ttl: float) -> int:
    """The ``CLOCK_BOOTTIME`` ns a lease granted or renewed at ``sent_ns`` (before the
    request left) is surely held until: the server starts its ttl later than that."""
    return sent_ns + int(ttl * (1.0 - RATE_ERROR) * 1e9) - MARGIN_NS


@final
@dataclass(frozen=True, slots=True)
class Record:
    """A budget's record on this host at one moment (see the module)."""

    total: int
    steward: tuple[int, int] | None
    steward_until_ns: int
    deadline_ns: int
    cap: int
    lost: bool
    max_live: int
    min_idle: int
    host: str
    units: list[Any]
    post: list[Any] | None

    def usable(self, now_ns: int, stop_lead: float) -> int:
        """The cap in force at ``now_ns``: the cap, or 0 from ``stop_lead`` seconds before
        the deadline on."""
        return self.cap if now_ns < self.deadline_ns - int(stop_lead * 1e9) else 0


@final
class Board:
    """A budget's record in the fleet's board (see the module).

    Args:
        fleet: this process's fleet.
        budget: the budget.
        max_live, min_idle: the opening pool's options (the steward sizes demand by them).

    Raises:
        BudgetMismatch: the host's record holds another total for the budget.
        FleetError: every record is taken by other budgets.
        LayoutMismatch, AccessDenied: as any fleet object.
    """

    def __init__(self, fleet: Fleet, budget: Budget, max_live: int, min_idle: int) -> None:
        self.budget = budget
        self._region: Region = fleet.region(BOARD_KIND, SIZE, _init, _validate)
        key = budget.key.value
        self._lohi = (key & (1 << 64) - 1, key >> 64)
        self._stop_lead_ns = int(budget.stop_lead * 1e9)
        with self._section():
            self._at = self._install(fleet.name, max_live, min_idle)

    def _install(self, fleet_name: str, max_live: int, min_idle: int) -> int:
        buf, free = self._region.buf, None
        for index in range(RECORDS):
            at = HEADER_SIZE + index * RECORD_SIZE
            head = HEAD.unpack_from(buf, at)
            if head[0] == 0:
                free = at if free is None else free
            elif (head[2], head[3]) == self._lohi:
                if head[1] != self.budget.total:
                    raise BudgetMismatch(
                        f"budget {self.budget.name!r} is used on this host under total "
                        f"{head[1]}, not {self.budget.total}",
                        key=self.budget.name,
                        total=self.budget.total,
                        found=head[1],
                    )
                self._set(at, head, max_live=max_live, min_idle=min_idle)
                return at
        if free is None:
            raise FleetError(
                f"fleet {fleet_name!r}: its board has room for {RECORDS} budgets, all in use"
            )
        self._write_blob(free, {"host": _host_id(fleet_name), "units": [], "post": None})
        self._set(free, HEAD.unpack_from(buf, free), state=1, total=self.budget.total,
                  key_lo=self._lohi[0], key_hi=self._lohi[1], steward_node=NO_NODE,
                  max_live=max_live, min_idle=min_idle)  # fmt: skip
        return free

    # -- reading ------------------------------------------------------------------------

    def read(self) -> Record:
        """The record now."""
        with self._section():
            return self._record()

    def _record(self) -> Record:
        head = HEAD.unpack_from(self._region.buf, self._at)
        blob = self._read_blob(head)
        steward = None if head[4] == NO_NODE or not head[5] else (head[4], head[5])
        units = blob.get("units")
        post = blob.get("post")
        return Record(
            total=head[1],
            steward=steward,
            steward_until_ns=head[14],
            deadline_ns=head[6],
            cap=head[7],
            lost=bool(head[9]),
            max_live=head[10],
            min_idle=head[11],
            host=str(blob.get("host", "")),
            units=units if isinstance(units, list) else [],
            post=post if isinstance(post, list) else None,
        )

    # -- the steward --------------------------------------------------------------------

    def elect(self, me: tuple[int, int], over: Callable[[int, int], bool], lease_ns: int) -> bool:
        """Become the steward, with a lease of ``lease_ns``, if there is none, its life is
        ``over`` or its lease has run out (it is paused, or stuck); True if ``me`` is."""
        with self._section():
            head = HEAD.unpack_from(self._region.buf, self._at)
            current, now = (head[4], head[5]), boot_ns()
            if current == me:
                return True
            if head[4] != NO_NODE and head[5] and now < head[14] and not over(*current):
                return False
            self._set(self._at, head, steward_node=me[0], steward_incarnation=me[1],
                      steward_until=now + lease_ns)  # fmt: skip
            return True

    def beat(self, me: tuple[int, int], lease_ns: int) -> bool:
        """Extend steward ``me``'s lease to ``lease_ns`` from now; False if ``me`` is no
        longer the steward."""
        with self._section():
            head = HEAD.unpack_from(self._region.buf, self._at)
            if (head[4], head[5]) != me:
                return False
            self._set(self._at, head, steward_until=boot_ns() + lease_ns)
            return True

    def resign(self, me: tuple[int, int]) -> None:
        """Stop being the steward (no-op if ``me`` is not)."""
        with self._section():
            head = HEAD.unpack_from(self._region.buf, self._at)
            if (head[4], head[5]) == me:
                self._set(self._at, head, steward_node=NO_NODE, steward_incarnation=0,
                          steward_until=0)  # fmt: skip

    def write(
        self,
        me: tuple[int, int],
        *,
        units: list[Any] | None = None,
        post: list[Any] | bool | None = False,
        deadline_ns: int | None = None,
        cap: int | None = None,
        lost: bool | None = None,
    ) -> bool:
        """Change the record as steward ``me`` (``post=False``: keep the post); False, and
        nothing changed, if ``me`` is no longer the steward."""
        with self._section():
            buf = self._region.buf
            head = HEAD.unpack_from(buf, self._at)
            if (head[4], head[5]) != me:
                return False
            if units is not None or post is not False:
                blob = self._read_blob(head)
                if units is not None:
                    blob["units"] = units
                if post is not False:
                    blob["post"] = post
                self._write_blob(self._at, blob)
                head = HEAD.unpack_from(buf, self._at)
            changes: dict[str, int] = {}
            if units is not None:
                changes["held"] = len(units)
            if deadline_ns is not None:
                changes["deadline"] = deadline_ns
            if cap is not None:
                changes["cap"] = cap
            if lost is not None:
                changes["lost"] = int(lost)
            self._set(self._at, head, **changes)
            return True

    def shrink(self, me: tuple[int, int], cap: int, used: Callable[[], int]) -> list[Any] | None:
        """Lower the cap to ``cap`` and take out the units above ``max(cap, used())``.

        ``used`` counts the key's live and creating clients (a pool table step); it
        runs inside the board's section, so no claim comes between the count and the
        units taken out. Returns the units taken out, for the steward to give back
        (None if ``me`` is no longer the steward).
        """
        with self._section():
            buf = self._region.buf
            head = HEAD.unpack_from(buf, self._at)
            if (head[4], head[5]) != me:
                return None
            cap = min(cap, head[7])
            blob = self._read_blob(head)
            found = blob.get("units")
            units: list[Any] = found if isinstance(found, list) else []
            keep = max(cap, used())
            taken = units[keep:] if keep < len(units) else []
            if taken:
                blob["units"] = units[:keep]
                self._write_blob(self._at, blob)
                head = HEAD.unpack_from(buf, self._at)
            self._set(self._at, head, cap=cap, held=len(units) - len(taken))
            return taken

    # -- a claim under the cap ------------------------------------------------------------

    def capped(self, claim: Callable[[int], T]) -> T:
        """``claim(cap)`` inside the board's section, ``cap`` the one in force now (0 from
        ``stop_lead`` before the deadline on)."""
        with self._section():
            head = HEAD.unpack_from(self._region.buf, self._at)
            cap = head[7] if boot_ns() < head[6] - self._stop_lead_ns else 0
            return claim(cap)

    # -- bytes --------------------------------------------------------------------------

    def _section(self) -> _Section:
        return _Section(self._region)

    def _set(self, at: int, head: tuple[Any, ...], **changes: int) -> None:
        fields = dict(zip(_HEAD_NAMES, head, strict=True))
        fields.update(changes)
        store(self._region.buf, at, HEAD, *(fields[name] for name in _HEAD_NAMES))

    def _read_blob(self, head: tuple[Any, ...]) -> dict[str, Any]:
        size, crc = head[12], head[13]
        start = self._at + RECORD_HEAD
        raw = bytes(self._region.buf[start : start + min(size, RECORD_SIZE - RECORD_HEAD)])
        if len(raw) != size or zlib.crc32(raw) != crc:
            return {}  # damage, or a writer killed mid-write: no units to renew
        try:
            found = json.loads(raw)
        except ValueError:
            return {}
        return found if isinstance(found, dict) else {}

    def _write_blob(self, at: int, blob: dict[str, Any]) -> None:
        raw = json.dumps(blob, separators=(",", ":")).encode()
        if len(raw) > RECORD_SIZE - RECORD_HEAD:
            raise FleetError(f"budget {self.budget.name!r}: its record is full")
        buf = self._region.buf
        start = at + RECORD_HEAD
        buf[start : start + len(raw)] = raw
        head = HEAD.unpack_from(buf, at)
        self._set(at, head, blob_len=len(raw), blob_crc=zlib.crc32(raw))

    def __repr__(self) -> str:
        return f"<Board budget={self.budget.name!r}>"


_HEAD_NAMES: Final = (
    "state", "total", "key_lo", "key_hi", "steward_node", "steward_incarnation", "deadline",
    "cap", "held", "lost", "max_live", "min_idle", "blob_len", "blob_crc", "steward_until",
)  # fmt: skip


@final
@dataclass(frozen=True, slots=True)
class Seen:
    """One budget's record on a host, as an observer reads it (:func:`observe_board`).

    Attributes:
        key: the budget's pool key.
        total: the budget's total.
        units: the units the host holds.
        cap: the cap the steward set (live and creating clients stay at most this).
        lapse_s: seconds the units are surely held by this host's clock (0 when it
            holds none, or they may have lapsed).
    """

    key: Key
    total: int
    units: int
    cap: int
    lapse_s: float


def observe_board(fleet_name: str) -> list[Seen]:
    """The budgets of a fleet's board, read once without joining the fleet (nothing is
    held or written: a record being written may show its numbers before and after);
    [] when the fleet has no board.

    Raises:
        LayoutMismatch: the object is no board of this release's layout.
        AccessDenied: the object is not the user's own.
    """
    name = object_name(fleet_name, BOARD_KIND)
    if object_size(name) is None:
        return []
    data = read_prefix(name, SIZE)
    _validate(data)
    now, seen = boot_ns(), []
    for index in range(RECORDS):
        head = HEAD.unpack_from(data, HEADER_SIZE + index * RECORD_SIZE)
        if head[0] != 1:
            continue
        key = Key(head[2] | head[3] << 64)
        lapse_s = max(0.0, (head[6] - now) / 1e9) if head[8] else 0.0
        seen.append(Seen(key, head[1], head[8], head[7], lapse_s))
    return seen


class _Section:
    """``with`` the region's critical section."""

    __slots__ = ("_region",)

    def __init__(self, region: Region) -> None:
        self._region = region

    def __enter__(self) -> None:
        self._region.acquire()

    def __exit__(self, *exc: object) -> None:
        self._region.release()


def _host_id(fleet_name: str) -> str:
    """This host's id in the coordinator: its name, the fleet's, and a random tag (no
    spaces: a post's owner string separates its fields with them)."""
    name = "".join(char if char.isprintable() and not char.isspace() else "_"
                   for char in socket.gethostname())[:63] or "host"  # fmt: skip
    return f"{name}/{fleet_name}/{secrets.token_hex(4)}"


def _init(buf: mmap.mmap) -> None:
    raw = HEADER.pack(MAGIC, LAYOUT_VERSION, HEADER_SIZE, RECORDS, RECORD_SIZE, 0)
    raw = raw[:HEADER_CHECKED] + struct.pack("<I", zlib.crc32(raw[:HEADER_CHECKED]))
    buf[:HEADER_SIZE] = raw


def _validate(buf: mmap.mmap | bytes) -> None:
    raw = bytes(buf[:HEADER_SIZE])
    *found, checksum = HEADER.unpack(raw)
    expected = [MAGIC, LAYOUT_VERSION, HEADER_SIZE, RECORDS, RECORD_SIZE]
    if found != expected:
        raise LayoutMismatch(
            f"budget board (kind {BOARD_KIND}) header is {found!r}, this process expects "
            f"{expected!r}",
            kind=BOARD_KIND,
        )
    if zlib.crc32(raw[:HEADER_CHECKED]) != checksum:
        raise LayoutMismatch(
            f"budget board (kind {BOARD_KIND}) header checksum does not match its bytes",
            kind=BOARD_KIND,
        )
