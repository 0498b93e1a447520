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
  a busy worker does. (CPU here leaves the busy process out.)
* ``router`` and ``router, GIL busy``: through transaction mode's reference
  router (:class:`orbitive.clients._router.Router`, in Python) in a process of its
  own, on one server connection, with and without such a thread beside it: what
  the router's decisions (framing, statement names, the transaction's end) add to
  a plain relay.
* ``router, loan``: through a reference router whose key's only connection another
  process's router holds: every statement is a loan (the lease reserved, carried and
  accepted, the statement relayed twice, the owner's DONE).

Then, on the direct connection, the cost of the session-state checks the router
runs after a transaction that may have left state behind: its state check
(advisory locks, temporary tables, holdable cursors) and its settings check
(settings changed in the session, the one check that reads every setting).

Reported per case: the median and p99 round trip in µs, and the CPU µs per
statement of every process on the path (client, relays, backend). Run:
``python -m bench.txn_hop [--statements N]`` (PostgreSQL started by it).
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing
import os
import selectors
import signal
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import psycopg

from orbitive import Fleet
from orbitive.clients import ClientPool, PoolOptions, _client_state
from orbitive.clients._router import Router
from tests._fleets import remove_fleet_files
from tests._servers import TempPostgres

STATE_CHECK: Final = _client_state.STATE_CHECK.decode()
SETTINGS_CHECK: Final = _client_state.settings_check().decode()
_TICKS: Final = os.sysconf("SC_CLK_TCK")


def _relay(listen: str, upstream: str) -> None:
    """Accept one connection on ``listen`` and copy bytes both ways to ``upstream``."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(listen + ".new")
    server.listen(1)
    os.rename(listen + ".new", listen)  # found only once it listens
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


def _spin() -> None:
    count = 0
    while True:
        count += 1


def _busy_relay(listen: str, upstream: str) -> None:
    """:func:`_relay`, with another thread of the process running Python all along."""
    threading.Thread(target=_spin, daemon=True).start()
    _relay(listen, upstream)


def _router(listen: str, upstream: str, busy: bool = False, fleet: Fleet | None = None) -> None:
    """Transaction mode's reference router on ``listen``, on a pool of one server
    connection to the server whose socket is ``upstream`` (on ``fleet``, or a fleet of
    its own); this thread spins when ``busy``."""
    folder, name = os.path.split(listen)
    upstream_folder, upstream_name = os.path.split(upstream)
    conninfo = psycopg.conninfo.make_conninfo(
        host=upstream_folder,
        port=int(upstream_name.rsplit(".", 1)[1]),
        user="postgres",
        dbname="postgres",
    )
    pool: ClientPool[psycopg.Connection[Any]] = ClientPool(
        fleet or Fleet.local(_LOCAL_FLEET, 1),
        conninfo,
        create=functools.partial(psycopg.connect, conninfo, autocommit=True),
        close=psycopg.Connection.close,
        options=PoolOptions(max_live=1, max_idle=1),
        lends=True,
    )
    Router(folder, int(name.rsplit(".", 1)[1]), pool)
    if busy:
        _spin()
    threading.Event().wait()


def _owner(listen: str, upstream: str) -> None:
    """A router of the fleet of :func:`_loaning_router` that takes its key's only
    connection over and lends it; its pid goes beside ``listen``."""
    Path(listen).parent.parent.joinpath("pids").write_text(str(os.getpid()))
    _router(listen, upstream, fleet=Fleet.join(_LOAN_FLEET, 4))


def _loaning_router(listen: str, upstream: str) -> None:
    """A router of a fleet of two whose key's only connection another process's router
    holds: each statement runs there, on a loan (two relays in Python)."""
    fleet = Fleet.join(_LOAN_FLEET, 4)
    here, owner = (str(Path(listen).parent / side / Path(listen).name) for side in "bo")
    for path in (here, owner):
        Path(path).parent.mkdir()
    serving = threading.Thread(target=_router, args=(here, upstream), kwargs={"fleet": fleet})
    serving.start()  # its router opens the connection
    while not os.path.exists(here):
        time.sleep(0.01)
    if os.fork() == 0:  # a daemonic process starts no multiprocessing child
        try:
            _owner(owner, upstream)
        finally:
            os._exit(1)
    while not os.path.exists(owner):
        time.sleep(0.01)  # the owner's router took the connection over
    os.symlink(here, listen)
    serving.join()


def _busy_router(listen: str, upstream: str) -> None:
    _router(listen, upstream, busy=True)


#: What runs at each hop of a path, by name.
HOPS: Final = {
    "relay": _relay,
    "busy relay": _busy_relay,
    "router": _router,
    "busy router": _busy_router,
    "loan": _loaning_router,
}
_LOAN_FLEET: Final = f"txnhop{os.getpid()}"
_LOCAL_FLEET: Final = f"txnhop{os.getpid()}l"


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
    hops: tuple[str, ...], pg: TempPostgres, work: Path, run: Callable[[Conn, list[int]], Row]
) -> Row:
    """Run ``run`` on a connection through a process per hop (:data:`HOPS`, folders
    under ``work``); the CPU of a busy one is not counted."""
    upstream = str(pg.root / f".s.PGSQL.{pg.port}")
    relays: list[multiprocessing.Process] = []
    busy = any(hop.startswith("busy") for hop in hops)
    for number, hop in enumerate(hops):
        folder = work / f"hop{number}"
        folder.mkdir(parents=True)
        listen = str(folder / f".s.PGSQL.{pg.port}")
        target = HOPS[hop]
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
            return run(conn, pids + _owners(work))
    finally:
        for relay in relays:
            relay.join(5)
            relay.kill()
        for pid in _owners(work):
            os.kill(pid, signal.SIGKILL)


def _owners(work: Path) -> list[int]:
    """The processes of loans' owners on a path (:func:`_owner`)."""
    return [int(found.read_text()) for found in work.glob("*/pids")]


#: (label, the hops on the path, statement, share of ``--statements`` it runs).
CASES: Final = (
    ("direct", (), "SELECT 1", 1.0),
    ("1 hop", ("relay",), "SELECT 1", 1.0),
    ("2 hops", ("relay", "relay"), "SELECT 1", 1.0),
    ("1 hop, GIL busy", ("busy relay",), "SELECT 1", 0.1),
    ("router", ("router",), "SELECT 1", 1.0),
    ("router, GIL busy", ("busy router",), "SELECT 1", 0.1),
    ("router, loan", ("loan",), "SELECT 1", 1.0),
    ("direct, state check", (), STATE_CHECK, 0.25),
    ("direct, settings", (), SETTINGS_CHECK, 0.25),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--statements", type=int, default=4000)
    args = parser.parse_args()
    pg = TempPostgres.start()
    rows: list[tuple[str, Row]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="orbit-hop-") as scratch:
            for number, (label, hops, query, share) in enumerate(CASES):
                count = int(args.statements * share)

                def run(conn: Conn, pids: list[int], query: str = query, count: int = count) -> Row:
                    return _measure(conn, query, count, pids)

                rows.append((label, _through(hops, pg, Path(scratch) / str(number), run)))
    finally:
        pg.stop()
        for fleet in (_LOAN_FLEET, _LOCAL_FLEET):
            remove_fleet_files(fleet)  # and the loan sockets of its routers
    print(f"{'path':<22}{'p50 µs':>10}{'p99 µs':>10}{'CPU µs/stmt':>14}")
    for label, row in rows:
        print(f"{label:<22}{row['p50_us']:>10.1f}{row['p99_us']:>10.1f}{row['cpu_us']:>14.1f}")


if __name__ == "__main__":
    main()
