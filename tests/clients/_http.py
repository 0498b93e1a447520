"""A small HTTP/1.1 load: keep-alive connections, each sending GETs one after another.

Light on CPU (raw asyncio streams, no client library), so on a 2-core machine
most of the time goes to the server under test; used by the FastAPI tests and
``bench/fastapi_bench.py``.
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


async def get(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str
) -> tuple[int, bytes]:
    """One GET on an open keep-alive connection: (status, body)."""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


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
