"""The other design of issue 23, as a bench-only prototype: a connection counts against
the total by holding one session advisory lock from a range of slots.

:class:`SlotConnection` is a ``psycopg.Connection`` whose ``connect`` opens a
session, then tries the slots ``(CLASSID, 0) .. (CLASSID, TOTAL - 1)`` in one
statement (``pg_try_advisory_lock`` in a ``LIMIT 1`` scan, so it takes at most
one). If it got one, the session keeps it until it ends (the server frees it
then, even if the process dies); if none is free, it closes the session (one
refused connect, counted by the server as a session) and polls again after
:data:`POLL_S`. Nothing tells a host who waits, or that a slot was freed: a
connection gives its slot up only by closing. The pool's reset (a rollback)
keeps the lock; ``DISCARD ALL`` or ``pg_advisory_unlock_all()`` would drop it.

``bench/budget_bench.py`` runs it as a host's ``connection_class``.
"""

from __future__ import annotations

import time
from typing import Any, Final

import psycopg

#: The advisory lock class of the slots (issue 23).
CLASSID: Final = 23
#: The slots, the bench's ``total``.
TOTAL: Final = 6
#: Seconds between two tries of a creation that found no slot free.
POLL_S: Final = 0.05
#: Take the first free slot of the range, at most one (the scan stops at the first row).
TAKE: Final = (
    "SELECT slot FROM generate_series(0, %s - 1) AS slot "
    "WHERE pg_try_advisory_lock(%s, slot) LIMIT 1"
)


class SlotConnection(psycopg.Connection[Any]):
    """A connection that holds one of :data:`TOTAL` advisory-lock slots (see the module)."""

    @classmethod
    def connect(cls, conninfo: str = "", **kwargs: Any) -> SlotConnection:
        """Open sessions until one takes a free slot (polling every :data:`POLL_S`)."""
        while True:
            conn = super().connect(conninfo, **kwargs)
            try:
                autocommit, conn.autocommit = conn.autocommit, True  # no BEGIN, no ROLLBACK
                row = conn.execute(TAKE, (TOTAL, CLASSID)).fetchone()
                conn.autocommit = autocommit
            except BaseException:
                conn.close()
                raise
            if row is not None:
                return conn
            conn.close()
            time.sleep(POLL_S)
