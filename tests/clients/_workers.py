"""What the client-pool tests' worker processes run (module-level, so spawn finds them).

Each worker joins the test's fleet as its own node, builds a pool and reports
through its channel. No test framework is imported here.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import threading
import time
from typing import Any

from orbitive import Fleet, OrbitError
from orbitive.clients import ClientPool, PoolOptions
from orbitive.clients.psycopg import AsyncConnectionPool, ConnectionPool

from .._processes import Channel

#: A query of about 1 ms on the server.
SLOW_QUERY = "SELECT pg_sleep(0.001)"
FAST_QUERY = "SELECT 1"


def psycopg_requests(
    channel: Channel,
    fleet_name: str,
    capacity: int,
    url: str,
    tag: str,
    options: dict[str, Any],
    requests: int,
    query: str,
) -> None:
    """Run ``requests`` queries through a ConnectionPool; report (ok, errors, statistics)."""
    with Fleet.join(fleet_name, capacity) as fleet:
        pool = ConnectionPool(
            url, fleet=fleet, kwargs={"application_name": tag}, options=PoolOptions(**options)
        )
        channel.send("ready")
        channel.recv()
        ok, errors = 0, []
        for _ in range(requests):
            try:
                with pool.connection() as conn:
                    conn.execute(query).fetchall()
                ok += 1
            except OrbitError as error:
                errors.append(repr(error))
        stats = pool.statistics()
        channel.send((ok, errors, stats.as_dict()))
        channel.recv()  # the test has looked at the fleet; now close
        pool.close()


def transaction_mode_worker(
    channel: Channel, fleet_name: str, url: str, table: str, worker: int, rounds: int
) -> None:
    """A worker of the fleet with a transaction-mode ConnectionPool (``max_live`` 2):
    four threads insert ``rounds`` rows each into ``table``, one transaction each;
    reports "done" (a thread's error fails the worker)."""
    errors: list[BaseException] = []
    with Fleet.join(fleet_name, 16) as fleet:
        options = PoolOptions(max_live=2, mode="transaction")
        with ConnectionPool(url, fleet=fleet, options=options) as pool:

            def work(thread: int) -> None:
                try:
                    for n in range(rounds):
                        with pool.connection() as conn:
                            conn.execute(
                                f'INSERT INTO "{table}" VALUES (%s, %s)',
                                (worker, thread * rounds + n),
                            )
                            conn.execute(SLOW_QUERY)
                except BaseException as error:
                    errors.append(error)

            threads = [threading.Thread(target=work, args=(number,)) for number in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
    if errors:
        raise errors[0]
    channel.send("done")


def psycopg_holder(
    channel: Channel, fleet_name: str, capacity: int, url: str, tag: str, max_live: int, hold: int
) -> None:
    """Check out ``hold`` connections and keep them until killed."""
    with Fleet.join(fleet_name, capacity) as fleet:
        pool = ConnectionPool(
            url,
            fleet=fleet,
            kwargs={"application_name": tag},
            options=PoolOptions(max_live=max_live),
        )
        held = [pool.getconn() for _ in range(hold)]
        channel.send(len(held))
        while True:
            time.sleep(60)


def psycopg_idle_holder(
    channel: Channel, fleet_name: str, capacity: int, url: str, tag: str, options: dict[str, Any]
) -> None:
    """Use ``max_live`` connections once, return them (idle here), then stay idle until told."""
    with Fleet.join(fleet_name, capacity) as fleet:
        pool = ConnectionPool(
            url, fleet=fleet, kwargs={"application_name": tag}, options=PoolOptions(**options)
        )
        held = [pool.getconn() for _ in range(pool.options.max_live)]
        for conn in held:
            pool.putconn(conn)
        channel.send(pool.statistics().local_idle)
        channel.recv()
        stats = pool.statistics()
        pool.close()
        channel.send(stats.as_dict())


def psycopg_async_requests(
    channel: Channel,
    fleet_name: str,
    capacity: int,
    url: str,
    tag: str,
    max_live: int,
    tasks: int,
    per_task: int,
) -> None:
    """``tasks`` concurrent tasks x ``per_task`` queries; report (ok, errors, worst loop lag)."""
    with Fleet.join(fleet_name, capacity) as fleet:
        channel.send("ready")
        channel.recv()
        channel.send(asyncio.run(_async_load(fleet, url, tag, max_live, tasks, per_task)))


async def _async_load(
    fleet: Fleet, url: str, tag: str, max_live: int, tasks: int, per_task: int
) -> tuple[int, list[str], float]:
    options = PoolOptions(max_live=max_live, acquire_timeout=30.0)
    async with AsyncConnectionPool(
        url, fleet=fleet, kwargs={"application_name": tag}, options=options
    ) as pool:
        errors: list[str] = []
        running = True
        lag = 0.0

        async def ticker() -> None:
            nonlocal lag
            loop = asyncio.get_running_loop()
            while running:
                started = loop.time()
                await asyncio.sleep(0.005)
                lag = max(lag, loop.time() - started - 0.005)

        async def worker() -> int:
            done = 0
            for _ in range(per_task):
                try:
                    async with pool.connection() as conn:
                        await conn.execute(SLOW_QUERY)
                    done += 1
                except OrbitError as error:
                    errors.append(repr(error))
            return done

        tick = asyncio.ensure_future(ticker())
        counts = await asyncio.gather(*(worker() for _ in range(tasks)))
        running = False
        await tick
        return sum(counts), errors, lag


def sqlalchemy_requests(
    channel: Channel, fleet_name: str, capacity: int, url: str, tag: str, max_live: int,
    requests: int,
) -> None:  # fmt: skip
    """Run ``requests`` queries through a SQLAlchemy engine on FleetPool; report (ok, errors)."""
    import sqlalchemy  # noqa: PLC0415 - only this worker needs it

    from orbitive.clients.sqlalchemy import FleetPool  # noqa: PLC0415 - as above

    with Fleet.join(fleet_name, capacity) as fleet:
        engine = sqlalchemy.create_engine(
            url.replace("postgresql://", "postgresql+psycopg://"),
            connect_args={"application_name": tag},
            poolclass=FleetPool,
            fleet=fleet,
            fleet_key=url,
            fleet_options=PoolOptions(max_live=max_live),
            pool_pre_ping=True,
        )
        channel.send("ready")
        channel.recv()
        ok, errors = 0, []
        for _ in range(requests):
            try:
                with engine.connect() as conn:
                    conn.execute(sqlalchemy.text(SLOW_QUERY)).fetchall()
                ok += 1
            except OrbitError as error:
                errors.append(repr(error))
        status = engine.pool.status()
        engine.dispose()
        channel.send((ok, errors, status))


def fake_holder(channel: Channel, fleet_name: str, capacity: int, in_use: int, idle: int) -> None:
    """Hold ``in_use`` fake clients and keep ``idle`` more idle, until killed."""
    from ._fakes import FakeClient, close  # noqa: PLC0415 - spawn imports this module lean

    with Fleet.join(fleet_name, capacity) as fleet:
        pool = ClientPool(
            fleet, "fake", create=FakeClient, close=close,
            options=PoolOptions(max_live=in_use + idle + 1),
        )  # fmt: skip
        returned = [pool.getconn() for _ in range(idle)]
        held = [pool.getconn() for _ in range(in_use)]
        for client in returned:
            pool.putconn(client)
        channel.send(len(held))
        while True:
            time.sleep(60)


def two_pools_holder(channel: Channel, fleet_name: str, capacity: int, name: str) -> None:
    """A client pool labelled ``db-NAME`` holding one fake client, and a resource pool
    key labelled ``jobs-NAME`` with one resource of 3 units; on "exit", closes the client
    pool and the pool handle (the resource stays, as a process's exit leaves it)."""
    from orbitive.pool import Key, Pool  # noqa: PLC0415

    from ._fakes import FakeClient, close  # noqa: PLC0415

    with Fleet.join(fleet_name, capacity) as fleet:
        clients = ClientPool(
            fleet, f"db-{name}", create=FakeClient, close=close,
            options=PoolOptions(max_live=2), label=f"db-{name}",
        )  # fmt: skip
        held = clients.getconn()
        with Pool(fleet) as pool:
            key = Key.digest(f"jobs-{name}".encode())
            pool.label_key(key, f"jobs-{name}")
            pool.register(key, 3)
            channel.send("ready")
            assert channel.recv(None) == "exit"
        clients.putconn(held)
        clients.close()


def hung_closer(channel: Channel, fleet_name: str, capacity: int, returns: int) -> None:
    """Return ``returns`` fake clients whose closes never finish (more than the closing
    threads), report the closing threads, then wait until killed."""
    import threading  # noqa: PLC0415 - spawn imports this module lean

    from ._fakes import FakeClient  # noqa: PLC0415

    never = threading.Event()
    with Fleet.join(fleet_name, capacity) as fleet:
        pool: ClientPool[FakeClient] = ClientPool(
            fleet, "fake", create=FakeClient, close=lambda client: never.wait(),
            options=PoolOptions(max_live=returns, max_idle=0),
        )  # fmt: skip
        for client in [pool.getconn() for _ in range(returns)]:
            pool.putconn(client)
        time.sleep(0.2)  # the closing threads start
        channel.send(sum(t.name == "orbit-clients-retire" for t in threading.enumerate()))
        while True:
            time.sleep(60)


# -- remote mode: a TCP echo client -------------------------------------------------------


def echo_connect(port: int) -> socket.socket:
    """A client: one TCP connection to the test's echo server."""
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def echo(sock: socket.socket, request: bytes) -> bytes:
    """The remote-mode handler: one round trip on the connection (``b"boom"`` raises)."""
    if request == b"boom":
        raise OSError("the handler refused boom")
    sock.sendall(request)
    reply = b""
    while len(reply) < len(request):
        reply += sock.recv(len(request) - len(reply))
    return reply


async def echo_async(sock: socket.socket, request: bytes) -> bytes:
    """A coroutine handler: the round trip on the loop's socket helpers."""
    loop = asyncio.get_running_loop()
    sock.setblocking(False)
    await loop.sock_sendall(sock, request)
    reply = b""
    while len(reply) < len(request):
        reply += await loop.sock_recv(sock, len(request) - len(reply))
    return reply


def remote_owner(
    channel: Channel, fleet_name: str, capacity: int, port: int, coroutine: bool
) -> None:
    """Own one idle echo connection and serve other processes' requests on it until told."""
    with Fleet.join(fleet_name, capacity) as fleet:
        pool = ClientPool(
            fleet, "echo", create=functools.partial(echo_connect, port),
            close=socket.socket.close, handler=echo_async if coroutine else echo,
            options=PoolOptions(max_live=1),
        )  # fmt: skip
        if coroutine:
            asyncio.run(_serve_until_told(channel, pool))
        else:
            assert pool.request(b"warm") == b"warm"
            channel.send("ready")
            channel.recv(None)
        channel.send(pool.statistics().as_dict())
        pool.close()


async def _serve_until_told(channel: Channel, pool: ClientPool[socket.socket]) -> None:
    assert await pool.request_async(b"warm") == b"warm"  # starts the server on this loop
    channel.send("ready")
    await asyncio.get_running_loop().run_in_executor(None, channel.recv, None)


def stuck_creator(channel: Channel, fleet_name: str, capacity: int) -> None:
    """Hold a creation claim for ever: ``create()`` never returns."""

    def create() -> object:
        channel.send("creating")
        while True:
            time.sleep(60)

    with Fleet.join(fleet_name, capacity) as fleet:
        pool: ClientPool[object] = ClientPool(
            fleet, "fake", create=create, close=lambda client: None,
            options=PoolOptions(max_live=1),
        )  # fmt: skip
        pool.getconn()


def counted_waiter(channel: Channel, fleet_name: str, capacity: int) -> None:
    """Count one waiter of this node on the fake pool's key until told to stop (or killed)."""
    from orbitive.clients._options import pool_key  # noqa: PLC0415 - spawn imports this lean
    from orbitive.pool import Pool  # noqa: PLC0415
    from orbitive.pool._availability import add_waiter  # noqa: PLC0415

    with Fleet.join(fleet_name, capacity) as fleet, Pool(fleet) as pool:
        add_waiter(pool._t(), pool_key("fake"), 1)
        channel.send("waiting")
        channel.recv(None)
        add_waiter(pool._t(), pool_key("fake"), -1)


def fake_borrower(channel: Channel, fleet_name: str, capacity: int, max_live: int) -> None:
    """Send remote-mode requests on the fake key until told to stop.

    Told "count", it answers how many requests ran on another process's client so far;
    told "stop", it reports (requests served, errors, that count).
    """
    from ._fakes import FakeClient, close, echo  # noqa: PLC0415 - spawn imports this lean

    with Fleet.join(fleet_name, capacity) as fleet:
        pool = ClientPool(
            fleet, "fake", create=FakeClient, close=close, handler=echo,
            # Short turns: its clients go back to the fleet often, so both sides borrow.
            options=PoolOptions(max_live=max_live, acquire_timeout=30.0, handoff_after=0.1),
        )  # fmt: skip
        channel.send("ready")
        ok, errors = 0, []
        while (message := _message(channel)) != "stop":
            if message == "count":
                channel.send(pool.statistics().borrowed_count)
            try:
                assert pool.request(b"ping") == b"ping"
                ok += 1
            except OrbitError as error:
                errors.append(repr(error))
        borrowed = pool.statistics().borrowed_count
        pool.close()
        channel.send((ok, errors, borrowed))


def _message(channel: Channel) -> object:
    """The test's message if it has sent one, else None (without waiting)."""
    try:
        return channel.recv(0)
    except TimeoutError:
        return None


def fake_churner(channel: Channel, fleet_name: str, capacity: int, max_live: int) -> None:
    """Threads check fake clients out and back as fast as they can, until killed."""
    import threading  # noqa: PLC0415 - only this worker needs it

    from ._fakes import FakeClient, close  # noqa: PLC0415 - spawn imports this module lean

    with Fleet.join(fleet_name, capacity) as fleet:
        pool = ClientPool(
            fleet, "fake", create=FakeClient, close=close,
            options=PoolOptions(max_live=max_live, handoff_uses=2, acquire_timeout=60.0),
        )  # fmt: skip

        def churn() -> None:
            while True:
                pool.putconn(pool.getconn())

        for _ in range(3):
            threading.Thread(target=churn, daemon=True).start()
        channel.send("churning")
        churn()


def fake_contender(
    channel: Channel, fleet_name: str, capacity: int, threads: int, seconds: float
) -> None:
    """On "go", ``threads`` threads check fake clients out (held 5 ms) for ``seconds``.

    Reports (checkouts, the errors' reprs).
    """
    import threading  # noqa: PLC0415 - only this worker needs it

    from ._fakes import FakeClient, close  # noqa: PLC0415 - spawn imports this module lean

    with Fleet.join(fleet_name, capacity) as fleet:
        options = PoolOptions(max_live=2, handoff_uses=4, acquire_timeout=10.0)
        pool = ClientPool(fleet, "fake", create=FakeClient, close=close, options=options)
        done, errors = [0], []
        channel.send("ready")
        channel.recv()
        until = time.monotonic() + seconds

        def contend() -> None:
            while time.monotonic() < until:
                try:
                    with pool.client():
                        time.sleep(0.005)
                    done[0] += 1
                except OrbitError as error:
                    errors.append(repr(error))

        workers = [threading.Thread(target=contend) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        pool.close()
        channel.send((done[0], errors))


def fake_request(channel: Channel, fleet_name: str, capacity: int, payload: bytes) -> None:
    """One remote-mode request on the fake key (max_live 1); report the reply or the error."""
    from ._fakes import FakeClient, close, echo  # noqa: PLC0415 - spawn imports this lean

    with Fleet.join(fleet_name, capacity) as fleet:
        pool = ClientPool(
            fleet, "fake", create=FakeClient, close=close, handler=echo,
            options=PoolOptions(max_live=1),
        )  # fmt: skip
        try:
            channel.send(pool.request(payload, timeout=10.0))
        except OrbitError as error:
            channel.send(repr(error))
        pool.close()


def queued_checkout(channel: Channel, fleet_name: str, capacity: int) -> None:
    """Report this node, check a client out of the fake pool (max_live 1), report "got",
    hold it until told, then give it back and close the pool."""
    from ._fakes import FakeClient, close  # noqa: PLC0415 - spawn imports this lean

    with Fleet.join(fleet_name, capacity) as fleet:
        options = PoolOptions(max_live=1, acquire_timeout=60.0)
        with ClientPool(fleet, "fake", create=FakeClient, close=close, options=options) as pool:
            channel.send(pool.table.node)
            client = pool.getconn()
            channel.send("got")
            channel.recv(None)
            pool.discard(client)


def metrics_worker(
    channel: Channel, fleet_name: str, capacity: int, url: str, tag: str, max_live: int
) -> None:
    """A psycopg pool driven by the test's commands, each answered when done:

    ``("churn", seconds)``: two threads run ~2 ms queries that long; answers how many.
    ``"hold"``: check a connection out and keep it. ``("wait", n)``: start ``n``
    threads that each wait for a connection and keep it. ``"release"``: give back
    every connection held (after the waiting threads got theirs). ``("late", s)``:
    a checkout that gives up after ``s`` seconds; answers the error's class name.
    ``"stats"``: ``statistics().as_dict()``. ``"close"``: close and exit.
    """
    with Fleet.join(fleet_name, capacity) as fleet:
        options = PoolOptions(max_live=max_live, max_idle=max_live)
        pool = ConnectionPool(url, fleet=fleet, kwargs={"application_name": tag}, options=options)
        held: list[Any] = []
        waiters: list[threading.Thread] = []

        def churn(until: float, done: list[int]) -> None:
            while time.monotonic() < until:
                with pool.connection() as conn:
                    conn.execute("SELECT pg_sleep(0.002)")
                done.append(1)

        def wait() -> None:
            held.append(pool.getconn(timeout=60.0))

        while True:
            command = channel.recv(None)
            if isinstance(command, tuple) and command[0] == "churn":
                done: list[int] = []
                until = time.monotonic() + command[1]
                threads = [threading.Thread(target=churn, args=(until, done)) for _ in range(2)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                channel.send(len(done))
            elif command == "hold":
                held.append(pool.getconn())
                channel.send("held")
            elif isinstance(command, tuple) and command[0] == "wait":
                waiters += [threading.Thread(target=wait) for _ in range(command[1])]
                for thread in waiters:
                    thread.start()
                channel.send("started")
            elif command == "release":
                for thread in waiters:
                    thread.join()
                waiters.clear()
                while held:
                    pool.putconn(held.pop())
                channel.send("released")
            elif isinstance(command, tuple) and command[0] == "late":
                try:
                    pool.putconn(pool.getconn(timeout=command[1]))
                    channel.send(None)
                except OrbitError as error:
                    channel.send(type(error).__name__)
            elif command == "stats":
                channel.send(pool.statistics().as_dict())
            else:
                pool.close()
                channel.send("closed")
                return


def metrics_scraper(channel: Channel, fleet_name: str) -> None:
    """A sidecar that never joins the fleet: answers each message with a scrape's text."""
    from prometheus_client import CollectorRegistry, generate_latest  # noqa: PLC0415

    from orbitive.metrics import FleetCollector  # noqa: PLC0415

    registry = CollectorRegistry()
    registry.register(FleetCollector(fleet_name))
    while channel.recv(None) != "stop":
        channel.send(generate_latest(registry).decode())


def sqlalchemy_holder(
    channel: Channel, fleet_name: str, capacity: int, url: str, max_live: int, hold: int
) -> None:
    """A sync engine (FleetPool, key from the URL) that holds ``hold`` connections until told."""
    from sqlalchemy import create_engine, text  # noqa: PLC0415 - only this worker needs it

    from orbitive.clients.sqlalchemy import FleetPool  # noqa: PLC0415

    with Fleet.join(fleet_name, capacity) as fleet:
        engine = create_engine(
            url, poolclass=FleetPool, fleet=fleet, fleet_options=PoolOptions(max_live=max_live)
        )
        held = [engine.connect() for _ in range(hold)]
        for conn in held:
            conn.execute(text("SELECT 1"))
        channel.send("holding")
        channel.recv()
        for conn in held:
            conn.close()
        engine.dispose()
        channel.send("done")


def budget_prober(channel: Channel, capacity: int) -> None:
    """Answer the test's probes until told to stop; one process for many tests' fleets.

    ``("probe", fleet, key, max_live, timeout)``: check ``max_live`` fake clients of
    ``key`` out at once (each within ``timeout``), give them back and close the pool;
    answers None, or the error's repr. ``("leave", fleet)``: leave that fleet (before
    the test removes its files). ``"stop"``: leave every fleet and return.
    """
    from ._fakes import FakeClient, close  # noqa: PLC0415 - spawn imports this module lean

    fleets: dict[str, Fleet] = {}
    while (message := channel.recv(None)) != "stop":
        verb, fleet_name, *rest = message
        if verb == "leave":
            left = fleets.pop(fleet_name, None)
            if left is not None:
                left.close()
            channel.send("left")
            continue
        if fleet_name not in fleets:
            fleets[fleet_name] = Fleet.join(fleet_name, capacity)
        key, max_live, timeout = rest
        options = PoolOptions(max_live=max_live, acquire_timeout=timeout)
        pool = ClientPool(fleets[fleet_name], key, create=FakeClient, close=close, options=options)
        held: list[FakeClient] = []
        try:
            held.extend(pool.getconn() for _ in range(max_live))
        except OrbitError as error:
            channel.send(f"{len(held)} of {max_live} at once, then {error!r}")
        else:
            channel.send(None)
        finally:
            for client in held:
                pool.putconn(client)
            pool.close()
    for fleet in fleets.values():
        fleet.close()
