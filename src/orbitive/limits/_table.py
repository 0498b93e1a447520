"""The rate-limit table: counters and moving windows in one SHM object of the fleet.

:class:`RateTable` holds one mapped table (``_layout``) and does every storage step
inside the object's critical section (the robust process-shared mutex of its
section block): the steps of ``limits``' three strategies over counter entries and
moving-window slots. The steps are short (a probe of at most
``_layout.PROBE`` slots and a few stores), so the asyncio storage runs them directly.
The hit of each strategy on a live key (and a refusal) is one C call
(``_fastpath.c``, :func:`c_steps`), which declines to the steps here for anything
else: these are its reference twin, same probe, checks and order of writes.

Kill safety (a process SIGKILLed at any instruction inside a step):

* A change of one aligned 8-byte word (a counter's value, a slot's expiry or its
  head and count, an entry's expiry set to 0 by a clear) is written in place: a
  killed writer leaves the old word or the new one.
* A change of more bytes (a new entry, a new window slot) is journaled: the old
  bytes are copied into the header's journal, the journal is armed (one 8-byte
  word naming their offset and length), the bytes are written, and the journal is
  disarmed. Every step first looks at the journal; an armed one means its writer
  died inside the section, and the old bytes are put back (its hit is not
  counted) before anything else is read.
* The timestamps of a moving-window acquire go into the ring's free positions (or
  over timestamps already out of the window) before its head and count are
  committed by one word: a writer killed before that leaves at most its own
  timestamps looking taken, never fewer than the window holds.

So a killed process leaves at most its own hit counted or not, and never a
half-written entry. Every field read is validated: a digest match counts only
with a finite expiry above now, a value of 0..2**62, a head below the window and a
count within it; anything else is a dead entry, reusable by the next insert.

Exactness: every step reads and writes under the section, the sliding-window
counter's reads and its increment in one step, so N processes admit exactly the
limit (``memory://``'s sliding window may refuse a hit it would admit, by its
revert; this one never needs to).
"""

from __future__ import annotations

import hashlib
import math
import struct
import time
from collections.abc import Callable
from typing import Final

from .._core import _native, _section
from .._core._errors import LayoutMismatch
from .._core._fleet import Fleet
from .._core._region import Region
from ._errors import RateTableFull
from ._layout import (
    ENTRIES_AT,
    ENTRY,
    ENTRY_SIZE,
    F64,
    HEAD_COUNT,
    JOURNAL_AT,
    RATE_KIND,
    ROLLBACKS_AT,
    SAVED_AT,
    SAVED_MAX,
    SLOT_HEAD,
    SLOT_HEAD_SIZE,
    U64,
    Geometry,
    init,
    validator,
)

try:
    from ._fastpath import Steps
except ImportError:  # not built: the Python steps below run
    Steps = None  # type: ignore[assignment, misc, unused-ignore]

#: Test-only: called with a point's name inside a step ("journaled": old bytes saved
#: and armed; "written": new bytes written, journal still armed; "stamped": a moving
#: window's timestamps written, head and count not yet); a test's hook may kill the
#: process there.
crash_hook: Callable[[str], None] | None = None
#: The previous and the current sliding-window counter keys at a time (epoch seconds).
Keys = Callable[[float], "tuple[str, str]"]

#: Largest counter value a table keeps (larger reads as a dead entry).
VALUE_MAX: Final = 1 << 62
#: Expiries at or above this (about year 2^31 AD) read as corrupt.
EXPIRES_MAX: Final = 1e15
_COUNTER: Final = b"orbit-counter"
_WINDOW: Final = b"orbit-window"
_DIGEST: Final = struct.Struct("<QQ")
_ZERO8: Final = bytes(8)
_unpack_entry = ENTRY.unpack_from
_unpack_slot = SLOT_HEAD.unpack_from
_unpack_u64 = U64.unpack_from
_unpack_f64 = F64.unpack_from


def digest(key: str, person: bytes) -> tuple[int, int]:
    """The (low, high) 64-bit halves of the BLAKE2b-128 digest of ``key`` (its UTF-8
    bytes, lone surrogates kept): never (0, 0), which marks an EMPTY slot."""
    raw = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16, person=person)
    lo, hi = _DIGEST.unpack(raw.digest())
    return (lo or 1, hi) if hi == 0 else (lo, hi)


#: Digests of the keys this process used last (a limiter hits the same keys again and
#: again), at most :data:`DIGESTS_KEPT` of each kind, emptied when full.
DIGESTS_KEPT: Final = 4096
_counter_digests: dict[str, tuple[int, int]] = {}
_window_digests: dict[str, tuple[int, int]] = {}


def _kept_digest(kept: dict[str, tuple[int, int]], key: str, person: bytes) -> tuple[int, int]:
    """``key``'s digest from ``kept``, computed and kept there when missing."""
    found = kept.get(key)
    if found is None:
        if len(kept) >= DIGESTS_KEPT:
            kept.clear()
        found = kept[key] = digest(key, person)
    return found


def counter_digest(key: str) -> tuple[int, int]:
    """The digest of a counter key (fixed window, sliding window)."""
    return _kept_digest(_counter_digests, key, _COUNTER)


def window_digest(key: str) -> tuple[int, int]:
    """The digest of a moving-window key."""
    return _kept_digest(_window_digests, key, _WINDOW)


def live(expires: float, now: float) -> bool:
    """Whether an expiry read from the table makes its entry live at ``now``."""
    return now < expires < EXPIRES_MAX


class RateTable:
    """One process's handle on the fleet's rate-limit table (see the module).

    Args:
        fleet: the joined fleet whose table it is.
        geometry: the table's sizes; an existing table must have the same.

    Raises:
        LayoutMismatch: the existing table has another geometry, version or checksum.
        AccessDenied: the object is not this user's own (owner, mode, symlink).
        ShmFull: ``/dev/shm`` has no room for a new table.
        FleetError: the fleet is closed.
    """

    def __init__(self, fleet: Fleet, geometry: Geometry) -> None:
        self.fleet = fleet.name
        self.geometry = geometry
        self.region: Region = fleet.region(
            RATE_KIND, geometry.size, init(geometry), validator(fleet.name, geometry)
        )
        self.buf = self.region.buf
        self._windows_at = geometry.windows_at
        self._slot_size = geometry.slot_size
        self._end = geometry.size
        self.steps = c_steps(self.region, geometry)

    # -- the journal ------------------------------------------------------------------

    def recover(self) -> None:
        """Inside the section: roll back the journal a dead writer left armed."""
        buf = self.buf
        armed = _unpack_u64(buf, JOURNAL_AT)[0]
        if armed == 0:
            return
        offset, length = armed & 0xFFFFFFFF, armed >> 32
        if not (0 < length <= SAVED_MAX and ENTRIES_AT <= offset <= self._end - length):
            raise LayoutMismatch(
                f"rate-limit table of fleet {self.fleet!r}: its journal names bytes "
                f"{offset}..{offset + length} outside the table (corrupt bytes); stop its "
                f"users and remove it: orbit clear {self.fleet} --kind {RATE_KIND}",
                fleet=self.fleet,
                kind=RATE_KIND,
            )
        buf[offset : offset + length] = buf[SAVED_AT : SAVED_AT + length]
        buf[JOURNAL_AT : JOURNAL_AT + 8] = _ZERO8
        rollbacks = _unpack_u64(buf, ROLLBACKS_AT)[0]
        buf[ROLLBACKS_AT : ROLLBACKS_AT + 8] = U64.pack(rollbacks + 1)

    def _journaled(self, at: int, new: bytes) -> None:
        """Write ``new`` (at most 32 bytes) at ``at`` under the journal."""
        buf, length = self.buf, len(new)
        buf[SAVED_AT : SAVED_AT + length] = buf[at : at + length]
        buf[JOURNAL_AT : JOURNAL_AT + 8] = U64.pack(at | length << 32)
        if crash_hook is not None:
            crash_hook("journaled")
        buf[at : at + length] = new
        if crash_hook is not None:
            crash_hook("written")
        buf[JOURNAL_AT : JOURNAL_AT + 8] = _ZERO8

    def rollbacks(self) -> int:
        """Journals rolled back since the table was made (statistics, read unlocked)."""
        return int(_unpack_u64(self.buf, ROLLBACKS_AT)[0])

    # -- counters -----------------------------------------------------------------------

    def _find(self, lo: int, hi: int, now: float) -> tuple[int, int]:
        """(offset of the key's live entry or -1, offset of the first reusable entry in
        its neighbourhood or -1). A miss that ends at an EMPTY entry turns the run of dead
        entries just before it EMPTY too (no probe can pass them to find anything)."""
        buf = self.buf

        def read(at: int) -> tuple[int, int, bool]:
            elo, ehi, expires, value = _unpack_entry(buf, at)
            return elo, ehi, live(expires, now) and 0 <= value < VALUE_MAX

        geometry = self.geometry
        return self._probe(
            lo, hi, read, ENTRIES_AT, ENTRY_SIZE, geometry.capacity, geometry.probe, ENTRY_SIZE
        )

    def _probe(
        self,
        lo: int,
        hi: int,
        read: Callable[[int], tuple[int, int, bool]],
        base: int,
        stride: int,
        count: int,
        probe: int,
        size: int,
    ) -> tuple[int, int]:
        """The linear probe of :meth:`_find` and :meth:`_find_slot` over ``count``
        records of ``stride`` bytes from ``base`` (``size`` bytes of each zeroed to make
        it EMPTY): ``read(at)`` gives a record's digest and whether it is usable (live)."""
        index = lo % count
        free = -1
        run: list[int] = []
        for _ in range(probe):
            at = base + stride * index
            rlo, rhi, usable = read(at)
            if rlo == lo and rhi == hi and usable:
                return at, free
            if rlo == 0 and rhi == 0:
                self._empty(run, size)
                return -1, at if free < 0 else free
            if usable:
                run.clear()
            else:
                run.append(at)
                if free < 0:
                    free = at
            index = index + 1 if index + 1 < count else 0
        return -1, free

    def _empty(self, run: list[int], size: int) -> None:
        """Zero the dead entries or slot headers at ``run`` (they read as EMPTY from their
        zero digest on, whatever a writer killed inside leaves of the rest)."""
        zero = bytes(size)
        for at in run:
            self.buf[at : at + size] = zero

    def _value(self, lo: int, hi: int, now: float) -> tuple[int, float]:
        at, _ = self._find(lo, hi, now)
        if at < 0:
            return 0, now
        _, _, expires, value = _unpack_entry(self.buf, at)
        return value, expires

    def _add(self, key: str, lo: int, hi: int, now: float, expiry: float, amount: int) -> int:
        """Add ``amount`` to the key's live entry, or write a new one (journaled); a
        counter stops at ``VALUE_MAX - 1``."""
        amount = min(amount, VALUE_MAX - 1)
        at, free = self._find(lo, hi, now)
        buf = self.buf
        if at >= 0:
            value = _unpack_entry(buf, at)[3] + amount
            if value >= VALUE_MAX:
                value = VALUE_MAX - 1
            buf[at + 24 : at + 32] = U64.pack(value)
            return int(value)
        if free < 0:
            raise self._full(key, "capacity", self.geometry.capacity)
        self._journaled(free, ENTRY.pack(lo, hi, now + expiry, amount))
        return amount

    def incr(self, key: str, expiry: float, amount: int) -> int:
        """Add ``amount`` to ``key``'s counter (a new one expires ``expiry`` s from now);
        the new value. The C step adds to a live counter; anything else runs here."""
        lo, hi = counter_digest(key)
        if self.steps is not None and crash_hook is None:
            value = self.steps.incr(lo, hi, expiry, amount)
            if value is not None:
                return value
        with self.region:
            self.recover()
            return self._add(key, lo, hi, time.time(), expiry, amount)

    def get(self, key: str) -> int:
        """``key``'s counter, 0 when absent or expired."""
        lo, hi = counter_digest(key)
        with self.region:
            self.recover()
            return self._value(lo, hi, time.time())[0]

    def get_expiry(self, key: str) -> float:
        """When ``key``'s counter expires, epoch seconds (now when absent)."""
        lo, hi = counter_digest(key)
        with self.region:
            self.recover()
            return self._value(lo, hi, time.time())[1]

    def clear(self, key: str) -> None:
        """Forget ``key``'s counter and moving window."""
        counter, window = counter_digest(key), window_digest(key)
        with self.region:
            self.recover()
            now = time.time()
            at, _ = self._find(*counter, now)
            if at >= 0:
                self.buf[at + 16 : at + 24] = _ZERO8
            at, _ = self._find_slot(*window, now)
            if at >= 0:
                self.buf[at + 16 : at + 24] = _ZERO8

    def reset(self) -> int:
        """Forget every counter and window; how many were live, as ``memory://`` counts
        them: the larger of the live counters and the live moving windows."""
        with self.region:
            self.recover()
            now, buf, counters, windows = time.time(), self.buf, 0, 0
            for at in range(
                ENTRIES_AT, ENTRIES_AT + ENTRY_SIZE * self.geometry.capacity, ENTRY_SIZE
            ):
                _, _, expires, value = _unpack_entry(buf, at)
                counters += live(expires, now) and 0 <= value < VALUE_MAX
                buf[at + 16 : at + 24] = _ZERO8
            for index in range(self.geometry.windows):
                at = self._windows_at + self._slot_size * index + 16
                windows += live(_unpack_f64(buf, at)[0], now)
                buf[at : at + 8] = _ZERO8
            # Every entry is dead now; EMPTY (zero) them too, so probes stop early again.
            buf[ENTRIES_AT : self._windows_at] = bytes(self._windows_at - ENTRIES_AT)
            for index in range(self.geometry.windows):
                at = self._windows_at + self._slot_size * index
                buf[at : at + SLOT_HEAD_SIZE] = bytes(SLOT_HEAD_SIZE)
            return max(counters, windows)

    # -- sliding window counter -----------------------------------------------------

    def sliding_window(self, keys: Keys, expiry: float) -> tuple[int, float, int, float]:
        """(previous count, its ttl, current count, its ttl) now, as ``memory://`` counts
        them; ``keys(now)`` names the previous and the current window's counters."""
        with self.region:
            self.recover()
            now = time.time()
            previous, current = keys(now)
            return self._sliding(counter_digest(previous), counter_digest(current), expiry, now)

    def _sliding(
        self, previous: tuple[int, int], current: tuple[int, int], expiry: float, now: float
    ) -> tuple[int, float, int, float]:
        previous_count = self._value(*previous, now)[0]
        current_count = self._value(*current, now)[0]
        previous_ttl = (
            0.0 if previous_count == 0 else (1 - (((now - expiry) / expiry) % 1)) * expiry
        )
        current_ttl = (1 - ((now / expiry) % 1)) * expiry + expiry
        return previous_count, previous_ttl, current_count, current_ttl

    def acquire_sliding(self, keys: Keys, limit: int, expiry: float, amount: int) -> bool:
        """Count ``amount`` in the current window now if the weighted count leaves room
        (``keys(now)`` as for :meth:`sliding_window`): read and counted in one step. The
        C step counts in a live current counter, or refuses; anything else runs here,
        at the time it enters the section."""
        if self.steps is not None and crash_hook is None:
            now = time.time()
            previous, current = keys(now)
            taken = self.steps.sliding(*counter_digest(previous), *counter_digest(current),
                                       limit, expiry, amount, now)  # fmt: skip
            if taken is not None:
                return taken
        with self.region:
            self.recover()
            now = time.time()
            previous, current = keys(now)
            return self._sliding_step(previous, current, limit, expiry, amount, now)

    def _sliding_step(
        self, previous: str, current: str, limit: int, expiry: float, amount: int, now: float
    ) -> bool:
        lo, hi = counter_digest(current)
        previous_count, previous_ttl, current_count, _ = self._sliding(
            counter_digest(previous), (lo, hi), expiry, now
        )
        weighted = previous_count * previous_ttl / expiry + current_count
        if math.floor(weighted) + amount > limit:
            return False
        self._add(current, lo, hi, now, 2 * expiry, amount)
        return True

    def clear_pair(self, keys: Keys) -> None:
        """Forget the previous and the current window's counters (``keys(now)``)."""
        with self.region:
            self.recover()
            now = time.time()
            for key in keys(now):
                at, _ = self._find(*counter_digest(key), now)
                if at >= 0:
                    self.buf[at + 16 : at + 24] = _ZERO8

    # -- moving windows ---------------------------------------------------------------

    def _find_slot(self, lo: int, hi: int, now: float) -> tuple[int, int]:
        """(offset of the key's live window slot or -1, offset of the first reusable slot
        in its neighbourhood or -1); a miss empties dead slots as :meth:`_find` does."""
        buf, window = self.buf, self.geometry.window

        def read(at: int) -> tuple[int, int, bool]:
            slo, shi, expires, head, count = _unpack_slot(buf, at)
            return slo, shi, live(expires, now) and head < window and count <= window

        geometry = self.geometry
        return self._probe(
            lo,
            hi,
            read,
            self._windows_at,
            self._slot_size,
            geometry.windows,
            geometry.window_probe,
            SLOT_HEAD_SIZE,
        )

    def acquire_entry(self, key: str, limit: int, expiry: float, amount: int) -> bool:
        """Add ``amount`` timestamps (now) to ``key``'s window if the window leaves room:
        fewer than ``limit - amount + 1`` timestamps newer than ``expiry`` s ago."""
        lo, hi = window_digest(key)
        if self.steps is not None and crash_hook is None:
            taken = self.steps.acquire(lo, hi, limit, expiry, amount)
            if taken is not None:
                return taken
        window = self.geometry.window
        with self.region:
            self.recover()
            buf, now = self.buf, time.time()
            at, free = self._find_slot(lo, hi, now)
            if at < 0:
                if free < 0:
                    raise self._full(key, "windows", self.geometry.windows)
                self._stamp(free, 0, amount, now)
                head = SLOT_HEAD.pack(lo, hi, now + expiry, amount % window, amount)
                self._journaled(free, head)
                return True
            _, _, expires, head, count = _unpack_slot(buf, at)
            gate = limit - amount
            if gate < count:
                stamp = _unpack_f64(buf, at + SLOT_HEAD_SIZE + 8 * ((head - 1 - gate) % window))[0]
                if stamp >= now - expiry:
                    return False
            self._stamp(at, head, amount, now)
            if now + expiry > expires:
                buf[at + 16 : at + 24] = F64.pack(now + expiry)
            buf[at + 24 : at + 32] = HEAD_COUNT.pack(
                (head + amount) % window, min(window, count + amount)
            )
            return True

    def _stamp(self, at: int, head: int, amount: int, now: float) -> None:
        """Write ``amount`` timestamps ``now`` into the ring of the slot at ``at`` from ``head``."""
        window, stamps = self.geometry.window, at + SLOT_HEAD_SIZE
        first = min(amount, window - head)
        self.buf[stamps + 8 * head : stamps + 8 * (head + first)] = F64.pack(now) * first
        if amount > first:
            self.buf[stamps : stamps + 8 * (amount - first)] = F64.pack(now) * (amount - first)
        if crash_hook is not None:
            crash_hook("stamped")

    def get_moving_window(self, key: str, expiry: float) -> tuple[float, int]:
        """(the oldest timestamp newer than ``expiry`` s ago, how many are): ``(now, 0)``
        when none is."""
        lo, hi = window_digest(key)
        window = self.geometry.window
        with self.region:
            self.recover()
            buf, now = self.buf, time.time()
            at, _ = self._find_slot(lo, hi, now)
            if at < 0:
                return now, 0
            _, _, _, head, count = _unpack_slot(buf, at)
            stamps = at + SLOT_HEAD_SIZE
            oldest, seen, floor = now, 0, now - expiry
            for back in range(count):
                stamp = _unpack_f64(buf, stamps + 8 * ((head - 1 - back) % window))[0]
                if not stamp > floor:
                    break
                oldest, seen = stamp, seen + 1
            return oldest, seen

    # -- errors and lifecycle -----------------------------------------------------------

    def _full(self, key: str, option: str, size: int) -> RateTableFull:
        what = "counter entry" if option == "capacity" else "moving-window slot"
        return RateTableFull(
            f"rate-limit table of fleet {self.fleet!r}: no free or expired {what} within "
            f"{min(size, 64)} slots of key {key[:60]!r}'s home ({option}={size}); nothing "
            f"was counted. Raise {option} in the storage URL (shm://{self.fleet}?{option}="
            f"{size * 2}), after clearing the table while nobody uses it",
            fleet=self.fleet,
            key=key,
            kind=RATE_KIND,
        )

    def close(self) -> None:
        """Unmap the table; never unlinks. Idempotent."""
        self.region.close()


#: What runs instead when ``_fastpath`` is not built (``_native.warn_python_steps``).
PYTHON_COST: Final = (
    "a rate-limit table's hits (every strategy) run in Python, about 12 times the cost "
    "of the C step (3 us instead of 0.3 us)"
)


def c_steps(region: Region, geometry: Geometry) -> Steps | None:
    """The C steps of the table in ``region`` (None: the Python steps run): None when the
    section is not a robust mutex the C code can lock, or the module is not built (which
    warns once per process)."""
    section = region.section
    if not region.shared or section is None or section.mechanism != _section.ROBUST_MUTEX:
        return None
    if Steps is None:
        _native.warn_python_steps("orbitive.limits._fastpath", PYTHON_COST)
        return None
    return Steps(region.buf, region.block, region.report_repaired, geometry.capacity,
                 geometry.probe, geometry.windows, geometry.window_probe, geometry.window,
                 geometry.windows_at, geometry.slot_size)  # fmt: skip
