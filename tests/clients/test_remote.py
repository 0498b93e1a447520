"""Remote mode: a request runs on another process's idle client, over a session to its owner."""

from __future__ import annotations

import asyncio
import functools
import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from orbitive import Fleet
from orbitive.clients import ClientPool, InvalidPoolOptions, PoolOptions, RemoteRequestError

from .._processes import Processes
from ._workers import echo, echo_connect, remote_owner
from .conftest import CAPACITY


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: EchoServer = self.server  # type: ignore[assignment]  # ours
        with server.lock:
            server.accepted += 1
        while data := self.request.recv(65536):
            self.request.sendall(data)


class EchoServer(socketserver.ThreadingTCPServer):
    """A TCP echo server that counts the connections it ever accepted."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Echo)
        self.accepted = 0
        self.lock = threading.Lock()


@pytest.fixture
def echo_server() -> Iterator[EchoServer]:
    server = EchoServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _borrower(fleet: Fleet, port: int) -> ClientPool[socket.socket]:
    return ClientPool(
        fleet, "echo", create=functools.partial(echo_connect, port),
        close=socket.socket.close, handler=echo, options=PoolOptions(max_live=1),
    )  # fmt: skip


@pytest.mark.parametrize("coroutine", [False, True], ids=["sync owner", "asyncio owner"])
def test_a_request_runs_on_the_idle_client_of_another_process(
    spawned: Processes, fleet: Fleet, echo_server: EchoServer, coroutine: bool
) -> None:
    port = echo_server.server_address[1]
    owner = spawned.start(remote_owner, fleet.name, CAPACITY, port, coroutine)
    assert owner.recv(60) == "ready"
    with _borrower(fleet, port) as pool:
        for number in range(20):
            payload = f"request {number}".encode()
            assert pool.request(payload, timeout=5.0) == payload
        assert pool.statistics().borrowed_count == 20
        assert pool.statistics().created_count == 0

        async def twice() -> list[bytes]:
            return list(await asyncio.gather(*(pool.request_async(b"a"), pool.request_async(b"b"))))

        assert asyncio.run(twice()) == [b"a", b"b"]
        if not coroutine:  # the owner's handler raises: a named error here
            with pytest.raises(RemoteRequestError, match="refused boom"):
                pool.request(b"boom", timeout=5.0)
    owner.send("report")
    served = owner.recv(60)
    assert owner.wait(60) == 0
    assert echo_server.accepted == 1  # one connection served every process
    assert served["created_count"] == 1


def test_a_request_without_an_owner_creates_and_bad_requests_are_named(
    fleet: Fleet, echo_server: EchoServer
) -> None:
    port = echo_server.server_address[1]
    with _borrower(fleet, port) as pool:
        assert pool.request(b"x") == b"x"  # nobody else: created here
        assert pool.statistics().created_count == 1
        with pytest.raises(InvalidPoolOptions):
            pool.request("text")  # type: ignore[arg-type]  # the error under test
    plain: ClientPool[object]
    with (
        ClientPool(fleet, "plain", create=object, close=lambda c: None) as plain,
        pytest.raises(InvalidPoolOptions),
    ):
        plain.request(b"x")
