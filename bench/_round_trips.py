"""A TCP proxy that counts round trips: each time a client speaks after the server did
(or first), one more. ``bench/budget_bench.py`` puts one in front of the coordinator
and one in front of the capped server to count what one checkout costs."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Final

#: Bytes read at once from either side.
CHUNK: Final = 65536


class RoundTripProxy:
    """Forward 127.0.0.1:``port`` to ``target_port`` on 127.0.0.1 in a thread of its own;
    :attr:`round_trips` counts the client's turns over every connection, :attr:`connects`
    the connections accepted. Use as a context manager."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.round_trips = 0
        self.connects = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="round-trip-proxy", daemon=True)

    def reset(self) -> tuple[int, int]:
        """The counts so far, (round trips, connects), and zero them."""
        counts = self.round_trips, self.connects
        self.round_trips = self.connects = 0
        return counts

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connects += 1
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        turn = ["server"]  # who spoke last

        async def pipe(read: asyncio.StreamReader, write: asyncio.StreamWriter, side: str) -> None:
            with contextlib.suppress(OSError):
                while data := await read.read(CHUNK):
                    if side == "client" and turn[0] == "server":
                        self.round_trips += 1
                    turn[0] = side
                    write.write(data)
                    await write.drain()
            write.close()

        with contextlib.suppress(asyncio.CancelledError):  # the proxy stops
            await asyncio.gather(
                pipe(client_r, server_w, "client"), pipe(server_r, client_w, "server")
            )

    def __enter__(self) -> RoundTripProxy:
        self._thread.start()
        self._ready.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
