"""A holder killed inside its own renewal keeps its key until the expiry it held.

On the Python steps the renewing holder stops at each crash-hook point its renewal
passes and is SIGKILLed there. On the C steps it is run through one renewal an
instruction at a time (``ptrace``): after every instruction its entry must still read
as its live tenure (what a kill there would leave), and a holder is SIGKILLed right
after each store its renewal makes to the entry. After each kill the entry, read
from shared memory, is still the killed tenure with an expiry no earlier than the one
it held, and a successor's ``try_acquire`` is refused it until that expiry (a grant is
checked against the table's clock, not against how long the test took to get there);
after it, it is granted, with a larger token.
"""

from __future__ import annotations

import signal
import time

import pytest

from orbitive.lock import Acquired, LockKey, LockLease, LockOwner, LockTable, Occupied, _steps
from orbitive.lock._layout import HEADER_SIZE, OCCUPIED, SLOT, SLOT_HEADER_SIZE

from .._children import RENEWED_NAMESPACE, renew_stopping_at, renew_traced
from .._processes import Child, Processes
from .._ptrace import single_step, wait_stopped

SURVIVOR = LockOwner(b"survivor")
#: The killed holders' ttl: long enough to outlast a renewal run one instruction at a
#: time on a busy machine, short enough to wait out. At 2 s, under scripts/sanitize with
#: two CPU burners, the lease of a spawned holder had lapsed before its check in 7 of 10
#: runs, up to 2.3 s before it (4.3 s from its grant to its check).
TTL = 8.0


def _entry_header(table: LockTable, slot: int) -> bytes:
    at = HEADER_SIZE + slot * table.layout.slot_size
    return bytes(table._buf[at : at + SLOT_HEADER_SIZE])


def _held(table: LockTable, lease: LockLease) -> float | None:
    """``lease``'s killed tenure holds its key until at least its expiry: its entry, read
    from shared memory, is that tenure's, and a successor's ``try_acquire`` is refused it
    or is granted it only once the expiry the entry held has passed (a loaded machine may
    come this late). Returns that expiry while refused, None once granted (with a larger
    token; the successor's lease is released)."""
    state, _, _, _, _, lock_id, _, _, expires = SLOT.unpack(_entry_header(table, lease.slot))
    assert (state, lock_id) == (OCCUPIED, lease.lock_id), f"{lease.key}: the entry is gone"
    assert expires >= round(lease.expires_at * 1000), (expires, lease)
    got = table.try_acquire(lease.key, SURVIVOR, 30.0)
    granted_by = time.monotonic()
    if isinstance(got, Occupied):
        assert got.lease.lock_id == lease.lock_id, got.lease
        assert round(got.lease.expires_at * 1000) == expires, (got.lease, expires)
        return got.lease.expires_at
    assert isinstance(got, Acquired), got
    early = expires / 1000 - granted_by
    assert early <= 0, f"{lease.key}: a successor got in {early:.3f} s early"
    assert got.lease.fencing_token > lease.fencing_token
    assert table.release(got.lease)
    return None


def _held_until_expiry(table: LockTable, held: dict[LockLease, float | None]) -> None:
    """Each killed holder's key (its lease: the expiry its entry held, None once a
    successor was granted it) stays held until that expiry, and is granted after it with
    a larger token."""
    live = {lease: ends for lease, ends in held.items() if ends is not None}
    for lease, ends in sorted(live.items(), key=lambda item: item[1]):
        time.sleep(max(0.0, ends - 0.05 - time.monotonic()))
        if _held(table, lease) is None:
            continue
        time.sleep(max(0.0, ends + 0.01 - time.monotonic()))
        taken = table.try_acquire(lease.key, SURVIVOR, 30.0)
        assert isinstance(taken, Acquired), taken
        assert taken.lease.fencing_token > lease.fencing_token


def _renewal_points(table: LockTable, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The crash-hook points a renewal on the Python steps passes, in order."""
    points: list[str] = []
    monkeypatch.setattr(_steps, "crash_hook", points.append)
    got = table.try_acquire(LockKey(RENEWED_NAMESPACE, "probe"), SURVIVOR, 30.0)
    assert isinstance(got, Acquired)
    del points[:]
    assert table.renew(got.lease, 30.0) is not None
    monkeypatch.setattr(_steps, "crash_hook", None)
    assert table.release(got.lease)
    return points


def test_a_holder_killed_at_every_hook_of_its_renewal_keeps_the_key_until_its_expiry(
    processes: Processes,
    shared_table: LockTable,
    fleet_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    points = _renewal_points(shared_table, monkeypatch)
    assert points, "a renewal passes no crash-hook point"
    held: dict[LockLease, float | None] = {}
    for point in points:
        victim = processes.start(renew_stopping_at, fleet_name, 4, point, TTL, point)
        lease: LockLease = victim.recv()
        assert victim.recv() == "stopped"
        assert victim.kill() == -signal.SIGKILL
        held[lease] = _held(shared_table, lease)
    _held_until_expiry(shared_table, held)


def _step_through_renewal(
    table: LockTable, victim: Child, lease: LockLease, stores: int | None
) -> list[bytes]:
    """Run ``victim``'s renewal of ``lease`` one instruction at a time, checking after each
    that its entry reads as that tenure, live until at least its expiry; stop after its
    ``stores``-th store to the entry (None: at the renewal's end). Returns the entry's
    header after each store."""
    wait_stopped(victim.pid)
    last = _entry_header(table, lease.slot)
    seen: list[bytes] = []
    expires_ms = round(lease.expires_at * 1000)
    while len(seen) != stores and single_step(victim.pid):
        header = _entry_header(table, lease.slot)
        if header == last:
            continue
        state, _, _, _, _, lock_id, _, _, expires = SLOT.unpack(header)
        assert (state, lock_id) == (OCCUPIED, lease.lock_id) and expires >= expires_ms, (
            f"store {len(seen) + 1} of the renewal left {SLOT.unpack(header)}"
        )
        seen.append(header)
        last = header
    return seen


def test_a_holder_killed_at_any_instruction_of_its_c_renewal_keeps_the_key_until_its_expiry(
    processes: Processes, shared_table: LockTable, fleet_name: str
) -> None:
    victim = processes.start(renew_traced, fleet_name, 4, "traced", TTL)
    lease: LockLease = victim.recv()
    if not victim.recv():
        pytest.skip("the C steps are not built")
    stores = _step_through_renewal(shared_table, victim, lease, None)
    assert stores, "the renewal never wrote its entry"
    assert SLOT.unpack(stores[-1])[8] > round(lease.expires_at * 1000)  # it was renewed
    assert victim.kill() == -signal.SIGKILL
    held = {lease: _held(shared_table, lease)}
    for count in range(1, len(stores)):  # killed right after each store but the last
        victim = processes.start(renew_traced, fleet_name, 4, f"killed-{count}", TTL)
        lease = victim.recv()
        assert victim.recv()
        assert len(_step_through_renewal(shared_table, victim, lease, count)) == count
        assert victim.kill() == -signal.SIGKILL
        held[lease] = _held(shared_table, lease)
    _held_until_expiry(shared_table, held)
