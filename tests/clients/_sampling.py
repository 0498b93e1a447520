"""Witnesses that sample while a test runs: the server's own connection count."""

from __future__ import annotations

import threading
import time
from types import TracebackType

import psycopg
from psycopg import sql

from orbitive.clients import ClientPoolStatistics

#: Seconds between two samples of pg_stat_activity.
SAMPLE_EVERY_S = 0.005


class ServerConnections:
    """A thread counting the server's client connections tagged ``tag`` until stopped.

    ``highest`` is the largest count seen and ``samples`` how many were taken;
    the sampler's own connection carries no tag. ``column`` is the
    ``pg_stat_activity`` column the tag is in (``usename``: the connections of
    one role).
    """

    def __init__(self, url: str, tag: str, column: str = "application_name") -> None:
        self.tag = tag
        # Client backends only: an autovacuum worker on the database has its datname
        # (one was the fourth "connection" of a cap of 3 under load).
        self._query = sql.SQL(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE {} = %s AND backend_type = 'client backend'"
        ).format(sql.Identifier(column))
        self.highest = 0
        self.samples = 0
        #: Every sample: its ``time.monotonic()`` and count.
        self.seen: list[tuple[float, int]] = []
        self._conn = psycopg.connect(url, autocommit=True)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def count(self) -> int:
        """Connections tagged ``tag`` now (one query; callable while sampling)."""
        with self._lock:
            row = self._conn.execute(self._query, (self.tag,)).fetchone()
        assert row is not None
        return int(row[0])

    def _run(self) -> None:
        while not self._stop.is_set():
            count = self.count()
            self.highest = max(self.highest, count)
            self.seen.append((time.monotonic(), count))
            self.samples += 1
            time.sleep(SAMPLE_EVERY_S)

    def wait_at_most(self, bound: int, timeout: float) -> int:
        """Poll until at most ``bound`` connections are open; the last count seen."""
        deadline = time.monotonic() + timeout
        seen = self.count()
        while seen > bound and time.monotonic() < deadline:
            time.sleep(0.02)
            seen = self.count()
        return seen

    def __enter__(self) -> ServerConnections:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()
        self._conn.close()


def busy(stats: ClientPoolStatistics) -> bool:
    """Clients of the key in use or being created (a create whose caller was cancelled
    goes on, and its client joins the idle ones or is closed when it is done)."""
    return bool(stats.in_use or stats.creating)
