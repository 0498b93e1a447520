"""What carrying a statement through one or two relaying processes costs, for transaction mode.

The transaction mode planned in ``docs/architecture.md`` ("Transaction mode") puts
a relay between a driver and the server: a local transaction crosses one (the
process's own router), a borrowed one two (the borrower's router, then the
owner's). This spike measures that cost with the simplest relay there is: a
Python process that copies bytes between two Unix sockets (``selectors``, 64 KiB
reads), so the figures are an upper bound for a relay in C that never takes the
GIL. One psycopg connection (autocommit) runs ``SELECT 1`` in a loop:

* ``direct``: to PostgreSQL's Unix socket;
* ``1 hop``: through one relay process;
* ``2 hops``: through two relay processes in a row;
* ``1 hop, GIL busy``: through one relay whose process also runs a Python
  thread that never blocks, as a worker's request thread computing: the relay
  thread waits for the GIL (``sys.getswitchinterval()``, 5 ms) after each read.
  A router in C that never takes the GIL has no such wait; a relay in Python in
  a busy worker does. (CPU here leaves the busy relay out.)

Then, on the direct connection, the cost of the session-state checks the design
runs after a transaction that may have left state behind: :data:`STATE_CHECK`
(advisory locks, temporary tables, holdable cursors, SQL prepared statements,
channels listened to) and :data:`SETTINGS_CHECK` (settings changed in the session,
the one check that reads every setting).

Reported per case: the median and p99 round trip in µs, and the CPU µs per
statement of every process on the path (client, relays, backend). Run:
``python -m bench.txn_hop [--statements N]`` (PostgreSQL started by it).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import selectors
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import psycopg

from tests._servers import TempPostgres

#: The check after a transaction whose tags or text may have left session state:
#: one statement reading only this backend's own state.
STATE_CHECK: Final = """SELECT
 (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
 (SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema()),
 (SELECT count(*) FROM pg_cursors WHERE is_holdable),
 (SELECT count(*) FROM pg_prepared_statements WHERE from_sql),
 (SELECT count(*) FROM pg_listening_channels())"""
#: Settings changed in this session (``SET``, ``set_config(..., false)``).
SETTINGS_CHECK: Final = "SELECT count(*) FROM pg_settings WHERE source = 'session'"
_TICKS: Final = os.sysconf("SC_CLK_TCK")


def _relay(listen: str, upstream: str) -> None:
    """Accept one connection on ``listen`` and copy bytes both ways to ``upstream``."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(listen)
    server.listen(1)
    client, _ = server.accept()
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    up.connect(upstream)
    pairs = {client.fileno(): up, up.fileno(): client}
    with selectors.DefaultSelector() as selector:
        selector.register(client, selectors.EVENT_READ)
        selector.register(up, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                if not data:
                    return
                pairs[key.fd].sendall(data)


def _busy_relay(listen: str, upstream: str) -> None:
    """:func:`_relay`, with another thread of the process running Python all along."""

    def spin() -> None:
        count = 0
        while True:
            count += 1

    threading.Thread(target=spin, daemon=True).start()
    _relay(listen, upstream)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


Row = dict[str, float]


def _measure(conn: psycopg.Connection[Any], query: str, count: int, pids: list[int]) -> Row:
    """Round trips of ``query`` on ``conn``: median and p99 µs, CPU µs per statement."""
    for _ in range(count // 10):  # warm-up
        conn.execute(query).fetchall()
    cpu0, own0 = sum(_cpu_s(pid) for pid in pids), time.process_time()
    laps: list[float] = []
    for _ in range(count):
        began = time.perf_counter_ns()
        conn.execute(query).fetchall()
        laps.append((time.perf_counter_ns() - began) / 1000)
    cpu = sum(_cpu_s(pid) for pid in pids) - cpu0 + time.process_time() - own0
    laps.sort()
    return {
        "p50_us": statistics.median(laps),
        "p99_us": laps[int(len(laps) * 0.99)],
        "cpu_us": cpu / count * 1e6,
    }


Conn = psycopg.Connection[tuple[int]]


def _through(
    hops: int, busy: bool, pg: TempPostgres, work: Path, run: Callable[[Conn, list[int]], Row]
) -> Row:
    """Run ``run`` on a connection through ``hops`` relay processes (folders under
    ``work``), :func:`_busy_relay` ones when ``busy`` (their CPU not counted)."""
    upstream = str(pg.root / f".s.PGSQL.{pg.port}")
    relays: list[multiprocessing.Process] = []
    for hop in range(hops):
        folder = work / f"hop{hop}"
        folder.mkdir(parents=True)
        listen = str(folder / f".s.PGSQL.{pg.port}")
        target = _busy_relay if busy else _relay
        relay = multiprocessing.Process(target=target, args=(listen, upstream), daemon=True)
        relay.start()
        while not os.path.exists(listen):
            time.sleep(0.01)
        relays.append(relay)
        upstream = listen
    host = str(Path(upstream).parent)
    try:
        with psycopg.connect(
            host=host, port=pg.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert backend is not None
            counted = [] if busy else relays
            pids = [backend[0], *(relay.pid for relay in counted if relay.pid is not None)]
            return run(conn, pids)
    finally:
        for relay in relays:
            relay.join(5)
            relay.kill()


#: (label, relays on the path, whether they are busy, statement, share of
#: ``--statements`` it runs).
CASES: Final = (
    ("direct", 0, False, "SELECT 1", 1.0),
    ("1 hop", 1, False, "SELECT 1", 1.0),
    ("2 hops", 2, False, "SELECT 1", 1.0),
    ("1 hop, GIL busy", 1, True, "SELECT 1", 0.1),
    ("direct, state check", 0, False, STATE_CHECK, 0.25),
    ("direct, settings", 0, False, SETTINGS_CHECK, 0.25),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--statements", type=int, default=4000)
    args = parser.parse_args()
    pg = TempPostgres.start()
    rows: list[tuple[str, Row]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="orbit-hop-") as scratch:
            for number, (label, hops, busy, query, share) in enumerate(CASES):
                count = int(args.statements * share)

                def run(conn: Conn, pids: list[int], query: str = query, count: int = count) -> Row:
                    return _measure(conn, query, count, pids)

                rows.append((label, _through(hops, busy, pg, Path(scratch) / str(number), run)))
    finally:
        pg.stop()
    print(f"{'path':<22}{'p50 µs':>10}{'p99 µs':>10}{'CPU µs/stmt':>14}")
    for label, row in rows:
        print(f"{label:<22}{row['p50_us']:>10.1f}{row['p99_us']:>10.1f}{row['cpu_us']:>14.1f}")


if __name__ == "__main__":
    main()
