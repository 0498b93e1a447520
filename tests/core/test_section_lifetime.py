"""A section block's mapping outlives every hold this process has on its mutexes.

glibc links each robust mutex a thread holds into that thread's robust list, through
the mutex's own bytes, and writes through the list on the thread's next lock. A
mapping unmapped under a held mutex would leave the list pointing into whatever is
mapped there next (a write into foreign memory, or a fault). These tests drop the
last reference to a region while its section is held, then map read-only pages
where the block was, so that such a write would fault, and lock another section.
"""

from __future__ import annotations

import gc
import mmap
import threading

import pytest

from orbitive._core._region import Region
from orbitive._core._section import recoveries

from .._processes import Channel, Processes
from .test_section import KIND, TWINS, lock_once, open_region, use_twin

#: Read-only pages mapped after a block went, so that a write through a dangling
#: robust list entry faults instead of landing somewhere unnoticed.
HOLES = 64


def lock_another(fleet_name: str) -> None:
    """Lock and unlock another object's section (glibc writes the robust list's head)."""
    holes = [mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ) for _ in range(HOLES)]
    other = Region.open_shared(fleet_name, KIND + 1, mmap.PAGESIZE, lambda buf: None, print)
    other.acquire()
    other.release()
    other.close()
    for hole in holes:
        hole.close()


def drop_while_held(channel: Channel, fleet_name: str, twin: str) -> None:
    """Hold a section, drop the region in the holding thread, then lock another section."""
    use_twin(twin)
    region = open_region(fleet_name)
    region.acquire()
    del region
    gc.collect()
    lock_another(fleet_name)
    channel.send("survived")


@pytest.mark.parametrize("twin", TWINS)
def test_a_region_dropped_by_the_thread_holding_it_lets_its_section_go(
    fleet_name: str, twin: str
) -> None:
    with Processes("fork") as processes:
        assert processes.start(drop_while_held, fleet_name, twin).recv() == "survived"
        # The abandoned hold was let go: another process locks at once, nothing to repair.
        assert processes.start(lock_once, fleet_name, "c").recv(timeout=5) == ("locked", 0)


def drop_while_another_thread_holds(channel: Channel, fleet_name: str, twin: str) -> None:
    """A thread holds a section whose region another thread drops; then it locks another."""
    use_twin(twin)
    box = [open_region(fleet_name)]
    held, dropped = threading.Event(), threading.Event()

    def hold() -> None:
        region = box[0]
        region.acquire()
        del region
        held.set()
        dropped.wait()
        lock_another(fleet_name)  # its robust list still holds the first section's mutex

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    box.clear()  # the last reference: the region goes in this thread, not the holder
    gc.collect()
    dropped.set()
    holder.join()
    channel.send("survived")


@pytest.mark.parametrize("twin", TWINS)
def test_a_block_another_thread_of_the_process_holds_stays_mapped(
    fleet_name: str, twin: str
) -> None:
    with Processes("fork") as processes:
        assert processes.start(drop_while_another_thread_holds, fleet_name, twin).recv() == (
            "survived"
        )
        # The holder ended holding it: the next locker repairs the mutex the kernel marked.
        locked, repaired = processes.start(lock_once, fleet_name, "c").recv(timeout=5)
        assert locked == "locked" and repaired == 1
    region = open_region(fleet_name)
    assert recoveries(region.block) == 1
    region.close()
    region.unlink()
