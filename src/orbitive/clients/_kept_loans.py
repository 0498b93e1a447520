"""The loan sockets a borrower's router keeps between loans: a socket to another
process's router whose loan ended released (the owner said :data:`~._loans.DONE`,
released) stays open, and carries the next loan to the same owner: no connect, accept
and close per loan. Each owner's router waits for the next lease frame on it.

Kept per owner (the path of its loan socket), at most :data:`KEPT_PER_OWNER` each;
the router's thread keeps them, its taker threads take them (:func:`~._loans.borrow`).
A kept socket its owner closed meanwhile is found out when the next lease goes on it
(a failed send, or no :data:`~._loans.ACCEPTED`): the lease then goes on a new one.
"""

from __future__ import annotations

import socket
import threading
from typing import Final, final

#: Sockets kept idle per owner at most (the borrower's peak of loans to it, bounded).
KEPT_PER_OWNER: Final = 8


@final
class KeptLoans:
    """Idle loan sockets by owner, thread-safe; :meth:`close` closes them all, and any
    kept after it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[str, list[socket.socket]] = {}
        self._closed = False

    def take(self, owner: str) -> socket.socket | None:
        """A socket kept for the owner whose loan socket is at ``owner``, now the
        caller's; None when none is."""
        with self._lock:
            idle = self._idle.get(owner)
            return idle.pop() if idle else None

    def keep(self, owner: str, sock: socket.socket) -> None:
        """Keep ``sock`` (its loan ended released, nothing of it unread) for the next
        loan to ``owner``; closed instead past :data:`KEPT_PER_OWNER`, or once closed."""
        with self._lock:
            idle = self._idle.setdefault(owner, [])
            if not self._closed and len(idle) < KEPT_PER_OWNER:
                idle.append(sock)
                return
        sock.close()

    def close(self) -> None:
        """Close every kept socket (its owner's router ends that borrower); later ones
        are closed as they come. Idempotent."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for socks in idle.values():
            for sock in socks:
                sock.close()
