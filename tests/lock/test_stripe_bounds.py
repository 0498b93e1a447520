"""A C step reads and writes only slots of the stripes it holds, whatever max_probe does.

The table is ``EDGE`` (64 slots, 32 stripes of 2). Slot 0 holds a live entry whose
home is slot 0, slot 1 a tombstone, slot 2 an expired entry, slot 3 a live one. A
child takes and gives back another key with home 0 on the C steps: with max_probe 1
its probe reads slots 0 and 1 only, so it holds stripe 0 only. Meanwhile the test
holds stripe 1 (slots 2 and 3) and moves max_probe between 1 and 2, as inserts of
keys in other stripes raise it while the step runs: a step that has covered the
bound 1 must not then probe as far as slot 2, which the test holds.
"""

from __future__ import annotations

import time

from orbitive import Fleet
from orbitive._core._robust import RobustMutex, _libc
from orbitive.lock import Acquired, LockKey, LockOwner, LockTable
from orbitive.lock._layout import HEADER_SIZE, MAX_PROBE_OFFSET, OCCUPIED, SLOT, TOMBSTONE

from .._capabilities import require_c_steps
from .._children import cycle_key
from .._processes import Processes
from .test_stripes import EDGE


def _home_zero_keys(count: int) -> list[LockKey]:
    keys = (LockKey("tests.bounds", f"home-{n}") for n in range(100_000))
    return [key for key in keys if key.digest & (EDGE.capacity - 1) == 0][:count]


def _raw_entry(expires: int) -> bytes:
    """An OCCUPIED slot head of a one-byte namespace, label and owner, and its payload."""
    return SLOT.pack(OCCUPIED, 1, 1, 1, 3, 1, 1, 1, expires) + b"abc"


def test_a_c_step_never_probes_past_the_bound_it_covered(fleet_name: str) -> None:
    holder, cycler = _home_zero_keys(2)
    with Fleet.join(fleet_name, 8) as fleet, Processes("fork") as processes:
        table = LockTable(fleet, EDGE)
        require_c_steps(table._steps, "orbitive.lock._fastpath")
        assert isinstance(table.try_acquire(holder, LockOwner(b"holder"), 600.0), Acquired)
        buf, stride = table._buf, EDGE.slot_size

        def at(slot: int) -> int:
            return HEADER_SIZE + slot * stride

        expired = _raw_entry(2)
        buf[at(1)] = TOMBSTONE
        buf[at(3) : at(3) + len(expired)] = _raw_entry(time.monotonic_ns() // 1_000_000 + 10**9)
        one, two = (1).to_bytes(4, "little"), (2).to_bytes(4, "little")
        buf[MAX_PROBE_OFFSET : MAX_PROBE_OFFSET + 4] = one
        stripes = RobustMutex(table._state.block, EDGE.stripes)
        stripe = stripes._mutexes[1]
        assert _libc is not None
        child = processes.start(cycle_key, fleet_name, EDGE, cycler, 3.0)
        assert child.recv() == "running"
        touched = 0
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and not touched:
            stripes._lock(stripe)
            buf[at(2) : at(2) + len(expired)] = expired
            for _ in range(5_000):
                buf[MAX_PROBE_OFFSET : MAX_PROBE_OFFSET + 4] = two
                buf[MAX_PROBE_OFFSET : MAX_PROBE_OFFSET + 4] = one
                if buf[at(2)] != OCCUPIED:
                    touched += 1  # a step that does not hold stripe 1 wrote slot 2
                    break
            _libc.pthread_mutex_unlock(stripe)
            time.sleep(0.0005)
        assert child.recv(timeout=30.0) > 0
        assert not touched, "a C step wrote slot 2 while another process held its stripe"
        table.close()
