"""A borrower process: reserve a unit, open a session to the owner, maybe die early."""

from __future__ import annotations

import socket

from orbitive import Fleet
from orbitive.pool import Pool, ResourceId
from orbitive.pool.session import open_session


def borrow(fleet_name: str, capacity: int, rid: ResourceId, path: str, payload: bytes) -> None:
    """Send the lease frame and ``payload``, then close the socket without waiting."""
    with Fleet.join(fleet_name, capacity) as fleet, Pool(fleet) as pool:
        lease = pool.reserve(rid)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(path)
            open_session(lease, sock, payload)
