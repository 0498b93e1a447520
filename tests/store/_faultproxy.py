"""A fault-injecting TCP proxy on 127.0.0.1, for the network-fault tests of the store.

``FaultProxy(upstream_port)`` listens on a free loopback port and relays every
connection to ``127.0.0.1:upstream_port`` from one thread (a selector loop that
wakes at least every :data:`_TICK_S`, so ``stop`` is prompt). Faults, armed from
the test:

* :meth:`lose_next_reply`: the next chunk the server sends is dropped and the
  client's connection reset (RST): the server did the work, the client never
  hears of it (a reply lost after commit).
* :meth:`reset_next_request`: the first half of the next chunk the client sends
  is relayed, then both connections are reset: the server sees half a statement
  and the client a reset (a reset mid-statement).
* :meth:`black_hole`: from now on nothing is relayed either way and nothing is
  closed, on open and new connections alike (no FIN, no RST: a silent network),
  until :meth:`heal`.
* :meth:`cut`: from now on every connection is reset as soon as it is accepted
  or sends anything (a cable pulled, a firewall rejecting), until :meth:`heal`.

``fired`` counts the one-shot faults that happened. Loopback only; every socket
is closed by :meth:`stop`.
"""

from __future__ import annotations

import contextlib
import enum
import selectors
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

_TICK_S: Final = 0.05
_CHUNK: Final = 65536
_RST: Final = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


class Fault(enum.Enum):
    NONE = "none"
    LOSE_REPLY = "lose-reply"
    RESET_REQUEST = "reset-request"


@dataclass(eq=False)
class _Link:
    """One relayed connection: the client's socket and the server's."""

    client: socket.socket
    server: socket.socket
    closed: bool = field(default=False)

    def peer(self, sock: socket.socket) -> socket.socket:
        return self.server if sock is self.client else self.client


class FaultProxy:
    """Relays 127.0.0.1:``port`` to 127.0.0.1:``upstream_port``, injecting armed faults."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._links: set[_Link] = set()
        self._mutex = threading.Lock()
        self._fault = Fault.NONE
        self._on_fire: Callable[[], None] | None = None
        self._silent = False
        self._cut = False
        self._stopped = threading.Event()
        self.fired = 0
        self._thread = threading.Thread(target=self._loop, name="fault-proxy", daemon=True)
        self._thread.start()

    # -- arming, from the test ------------------------------------------------------------

    def lose_next_reply(self, on_fire: Callable[[], None] | None = None) -> None:
        """Drop the server's next chunk and reset that client's connection.

        ``on_fire`` runs in the proxy's thread when the fault fires, before the
        client's connection is reset (so before any retry of the client's).
        """
        with self._mutex:
            self._fault, self._on_fire = Fault.LOSE_REPLY, on_fire

    def reset_next_request(self, on_fire: Callable[[], None] | None = None) -> None:
        """Relay half of the client's next chunk, then reset both connections (``on_fire``
        as for :meth:`lose_next_reply`)."""
        with self._mutex:
            self._fault, self._on_fire = Fault.RESET_REQUEST, on_fire

    def black_hole(self) -> None:
        """Relay nothing and close nothing until :meth:`heal`."""
        with self._mutex:
            self._silent = True

    def cut(self) -> None:
        """Reset every connection at its next byte, and every new one at once, until
        :meth:`heal`."""
        with self._mutex:
            self._cut = True

    def heal(self) -> None:
        """Relay again; connections that were black-holed stay open, their bytes are gone."""
        with self._mutex:
            self._silent = self._cut = False

    # -- the relay loop -----------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopped.is_set():
            for key, _ in self._selector.select(_TICK_S):
                if key.data is None:
                    self._accept()
                else:
                    self._relay(key.fileobj, key.data)  # type: ignore[arg-type]  # sockets only

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        if self._cut:
            with contextlib.suppress(OSError):
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
            client.close()
            return
        try:
            server = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5.0)
        except OSError:
            client.close()
            return
        link = _Link(client, server)
        self._links.add(link)
        for sock in (client, server):
            sock.setblocking(True)
            sock.settimeout(5.0)
            self._selector.register(sock, selectors.EVENT_READ, link)

    def _relay(self, sock: socket.socket, link: _Link) -> None:
        try:
            chunk = sock.recv(_CHUNK)
        except OSError:
            chunk = b""
        if not chunk:
            self._close(link, reset=False)
            return
        with self._mutex:
            fault, silent, cut = self._fault, self._silent, self._cut
            upward = sock is link.client
            if silent:
                return
            if cut:
                fault = Fault.NONE
            elif fault is Fault.LOSE_REPLY and not upward:
                self._fault, self.fired = Fault.NONE, self.fired + 1
            elif fault is Fault.RESET_REQUEST and upward:
                self._fault, self.fired = Fault.NONE, self.fired + 1
                with contextlib.suppress(OSError):
                    link.server.sendall(chunk[: len(chunk) // 2])
            else:
                fault = Fault.NONE
        if cut:
            self._close(link, reset=True)
            return
        if fault is Fault.NONE:
            try:
                link.peer(sock).sendall(chunk)
            except OSError:
                self._close(link, reset=False)
            return
        on_fire, self._on_fire = self._on_fire, None
        if on_fire is not None:
            on_fire()
        self._close(link, reset=True)

    def _close(self, link: _Link, *, reset: bool) -> None:
        if link.closed:
            return
        link.closed = True
        self._links.discard(link)
        for sock in (link.client, link.server):
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(sock)
            with contextlib.suppress(OSError):
                if reset:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RST)
                sock.close()

    def stop(self) -> None:
        """Stop relaying and close every socket (idempotent)."""
        self._stopped.set()
        self._thread.join(5.0)
        for link in list(self._links):
            self._close(link, reset=False)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(self._listener)
        self._listener.close()
        self._selector.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
