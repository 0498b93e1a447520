"""A small HTTP/1.1 load: keep-alive connections, each sending GETs one after another,
or (:func:`get_each_anew`) a new connection per GET.

Light on CPU (raw asyncio streams, no client library), so on a 2-core machine
most of the time goes to the server under test; used by the FastAPI tests, the rate
limit tests (tests/limits) and ``bench/fastapi_bench.py``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Load:
    """What a load saw: statuses, latencies (seconds) and connection errors."""

    statuses: Counter[int] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)


@dataclass(frozen=True)
class Answer:
    """One response: its status, its headers (names in lower case) and its body."""

    status: int
    headers: dict[str, str]
    body: bytes


async def request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, *, close: bool = False
) -> Answer:
    """One GET on an open connection (asking the server to close it after, if ``close``)."""
    extra = "Connection: close\r\n" if close else ""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\n{extra}\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    headers = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return Answer(status, headers, body)


async def get(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str
) -> tuple[int, bytes]:
    """One GET on an open keep-alive connection: (status, body)."""
    answer = await request(reader, writer, path)
    return answer.status, answer.body


async def run_load(
    port: int,
    path: Callable[[int], str],
    connections: int,
    *,
    requests: int | None = None,
    seconds: float | None = None,
    keep_bodies: bool = False,
) -> Load:
    """``connections`` keep-alive connections to 127.0.0.1:``port``, each sending
    ``requests`` GETs (or for ``seconds``), the n-th of all to ``path(n)``."""
    load = Load()
    counter = iter(range(1 << 62))
    end = None if seconds is None else time.monotonic() + seconds

    async def one() -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError as error:
            load.errors.append(repr(error))
            return
        try:
            done = 0
            while (requests is None or done < requests) and (end is None or time.monotonic() < end):
                start = time.perf_counter()
                status, body = await get(reader, writer, path(next(counter)))
                load.latencies.append(time.perf_counter() - start)
                load.statuses[status] += 1
                if keep_bodies:
                    load.bodies.append(body)
                done += 1
        except (OSError, asyncio.IncompleteReadError, ValueError) as error:
            load.errors.append(repr(error))
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(connections)))
    return load


def get_each_anew(
    port: int, path: str, count: int, *, concurrency: int, source: str = "127.0.0.1"
) -> list[Answer]:
    """``count`` GETs of ``path``, each on a new connection from address ``source`` (any of
    127.0.0.0/8), ``concurrency`` at a time: so a server's workers share them out, as they
    do requests from many clients, and a sync worker (which never keeps a connection)
    serves them too. The answers, in the order they came."""
    answers: list[Answer] = []
    left = iter(range(count))

    async def one() -> None:
        for _ in left:
            connection = asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
            reader, writer = await connection
            try:
                answers.append(await request(reader, writer, path, close=True))
            finally:
                writer.close()

    async def every() -> None:
        await asyncio.gather(*(one() for _ in range(concurrency)))

    asyncio.run(every())
    return answers


def get_json(port: int, path: str) -> Any:
    """One GET on a new connection; the JSON body."""

    async def once() -> Any:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            status, body = await get(reader, writer, path)
        finally:
            writer.close()
        assert status == 200, (status, body)
        return json.loads(body)

    return asyncio.run(once())
