"""A member that runs every table step in a tight loop until it is killed."""

from __future__ import annotations

import contextlib
from multiprocessing.synchronize import Event

from orbitive import Fleet
from orbitive._core._errors import OrbitError
from orbitive.pool import Key, Pool, ResourceId

KEY = Key(11)
CLAIM_KEY = Key(12)


def churn(fleet_name: str, capacity: int, theirs: ResourceId, running: Event) -> None:
    """Register, reserve theirs and cancel, use our own, claim and finish, unregister."""
    with Fleet.join(fleet_name, capacity) as fleet, Pool(fleet) as pool:
        running.set()
        while True:
            rid = pool.register(KEY, 2)
            with contextlib.suppress(OrbitError):
                pool.cancel_reservation(pool.reserve(theirs))
            pool.accept(pool.reserve(rid)).complete()
            pool.claim_create(CLAIM_KEY, 1_000).finish()
            pool.unregister(rid)
