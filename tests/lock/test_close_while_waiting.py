"""A fleet closed by one thread while another waits for the section inside a C operation.

Another process holds the state object's section; a thread of this process
waits for it inside ``try_acquire``'s C call (without the GIL). ``fleet.close()``
from the main thread must not wait for it, and the waiter, once the section is
free (released, or its holder killed), must get FleetError, never a read
through an unmapped table or a crash; later calls get FleetError too.
"""

from __future__ import annotations

import threading
import time

import pytest

from orbitive import Fleet, FleetError
from orbitive.lock import LockOwner, LockTable

from .._capabilities import require_c_steps
from .._children import KEY
from .._processes import Channel, Processes


def hold_the_section(channel: Channel, fleet_name: str) -> None:
    table = LockTable(Fleet.join(fleet_name, 4))
    table._state.acquire()
    channel.send("held")
    channel.recv(timeout=None)
    table._state.release()
    channel.send("released")


@pytest.mark.parametrize("freed_by", ["release", "kill"])
def test_a_waiter_inside_the_c_operation_gets_fleet_error_after_close(
    fleet_name: str, freed_by: str
) -> None:
    fleet = Fleet.join(fleet_name, 4)
    table = LockTable(fleet)
    require_c_steps(table._steps, "orbitive.lock._fastpath")
    outcome: list[BaseException | object] = []

    def wait_inside() -> None:
        try:
            outcome.append(table.try_acquire(KEY, LockOwner(b"waiter"), 30.0))
        except BaseException as error:  # recorded for the assertion
            outcome.append(error)

    with Processes("fork") as processes:
        holder = processes.start(hold_the_section, fleet_name)
        assert holder.recv() == "held"
        waiter = threading.Thread(target=wait_inside)
        waiter.start()
        time.sleep(0.2)  # the waiter is inside the C call, waiting for the mutex
        started = time.monotonic()
        fleet.close()
        assert time.monotonic() - started < 1.0, "close waited for the section"
        if freed_by == "release":
            holder.send("go")
            assert holder.recv() == "released"
        else:
            holder.kill()
        waiter.join(timeout=20.0)
        assert not waiter.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], FleetError), outcome
    with pytest.raises(FleetError):
        table.try_acquire(KEY, LockOwner(b"later"), 30.0)
