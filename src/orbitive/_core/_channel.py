"""A readiness channel: a shared u32 word counting publishes, and the sockets watching it.

A process that watches the word holds a :class:`~._readiness.Readiness`: a Unix
datagram socket of its own, whose descriptor ``select``, ``selectors`` and
asyncio watch. Its node's **armed** byte in the region has one bit per such
socket (at most :data:`SOCKETS_PER_NODE` per node and channel). A publisher,
inside the region's critical section, adds one to the word, takes every armed
bit (reads the bytes and writes zeros) and sends one empty datagram to each
socket whose bit it took: the publish itself makes the watcher's descriptor
readable, with no thread in between. The watcher's ``drain()`` reads the
datagrams and arms its bit again, inside the critical section.

Facts this module relies on:

* **A bound Unix datagram socket is an address on the file system.** ``sendto``
  to its path from any process that may write the path (we create it 0600, in
  ``/dev/shm`` next to the region, so only our user may) queues one datagram
  and makes the socket readable. Path sockets, unlike abstract ones, work
  across network namespaces, as the shared mappings do.
* **Sending never blocks and never fails the publisher.** ``MSG_DONTWAIT`` on a
  full queue raises ``EAGAIN``: the socket is readable already. A socket whose
  process died or closed it raises ``ECONNREFUSED`` or ``ENOENT``. Every such
  error is ignored: the bit was taken, so later publishes skip that socket
  until its owner (a new one on that node) arms a bit again. A publisher keeps
  a socket connected to each path it sent to (a send then costs no path
  lookup), and connects again when its peer is gone.
* **A socket of a killed process stays a file** until the next process on that
  node binds the same path, which replaces it (the node is exclusively ours,
  so nobody else can be using it). ``close()`` removes its own.
* **Fork.** A child inherits the descriptors, not the node: the parent's
  sockets stay the parent's (the child closes its copies; it never unlinks
  them), and the child's bit registry starts empty.

Why no signal is lost. Arming and publishing both run inside the region's
critical section (for a lock table, the C steps hold their key's stripes, and
arming holds every stripe), so they are ordered. A publish before the arm is
visible to whatever the watcher reads after its drain (the lock table's
``poll``, a store's next attempt); a publish after it finds the bit and sends.
Two C steps of different stripes may both see a bit and both send: a spurious
datagram, which costs a wake, never a loss.

A private region (``Fleet.local``) has no file: its sockets are socketpairs,
and the channel sends to their other ends.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import socket
import stat
import struct
import threading
from collections.abc import Callable
from typing import Final

from . import _fork
from ._access import euid
from ._errors import AccessDenied, FleetError, InvalidLayout
from ._region import SHM_DIR, Region

#: Sockets one node may watch one channel with (the bits of its armed byte).
SOCKETS_PER_NODE: Final = 8
#: Longest ``sun_path`` on Linux, without its terminating NUL.
_PATH_MAX: Final = 107
_U32: Final = struct.Struct("<I")


class _Registry:
    """This process's bits and private socket ends, per (channel identity, node), and the
    sockets its publishes send from, one connected to each path it signalled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.bits: dict[tuple[object, int], set[int]] = {}
        self.ends: dict[tuple[object, int, int], socket.socket] = {}
        self.senders: dict[str, socket.socket] = {}
        atexit.register(self.close_senders)

    def sender(self, path: str, stale: object) -> socket.socket:
        """A socket connected to ``path``: the one kept, unless its ``send`` is ``stale``
        (its peer is gone: a socket bound there since gets a new connection).

        Raises:
            OSError: nobody listens at ``path``.
        """
        with self.lock:
            kept = self.senders.get(path)
            if kept is not None and kept.send != stale:
                return kept
        fresh = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            fresh.connect(path)
        except OSError:
            fresh.close()
            raise
        with self.lock:
            kept, self.senders[path] = self.senders.get(path), fresh
        if kept is not None:
            kept.close()
        return fresh

    def close_senders(self) -> None:
        with self.lock:
            senders, self.senders = self.senders, {}
        for sender in senders.values():
            sender.close()

    def _after_fork_in_child(self) -> None:
        # The parent's bits belong to the parent's node; its private ends to its memory;
        # its senders are shared with it, harmlessly (each datagram is one signal).
        self.lock = threading.Lock()
        self.bits = {}
        self.ends = {}


_REGISTRY: Final = _Registry()
_fork.register(_REGISTRY)


class Channel:
    """One readiness word of a region, and its per-node armed bytes.

    Args:
        region: the region holding the word and the bytes (shared or private).
        word_offset: byte offset of the u32 word (4-byte aligned).
        armed_offset: byte offset of ``capacity`` armed bytes, one per node.
        capacity: the fleet capacity.

    Raises:
        InvalidLayout: an offset lies outside the region or the word is misaligned.
    """

    def __init__(self, region: Region, word_offset: int, armed_offset: int, capacity: int) -> None:
        size = len(region.buf)
        if not (0 <= word_offset <= size - 4 and word_offset % 4 == 0):
            raise InvalidLayout(f"readiness word offset {word_offset} is not an aligned u32")
        if capacity < 1 or armed_offset < 0 or armed_offset + capacity > size:
            raise InvalidLayout(f"readiness armed bytes {armed_offset} + {capacity} lie outside")
        self.region = region
        self.word_offset = word_offset
        self.armed_offset = armed_offset
        self.capacity = capacity
        self._armed = slice(armed_offset, armed_offset + capacity)
        self._zeros = bytes(capacity)
        # Peers find a shared channel's sockets by name; a private one lives in this process.
        self.identity: object = f"{region.name}.w{word_offset}" if region.shared else region
        #: By node * SOCKETS_PER_NODE + bit: the ``send`` of a socket connected to it.
        self._sends: dict[int, Callable[[bytes, int], int]] = {}

    # -- publishing ----------------------------------------------------------------------

    def bump(self) -> None:
        """Publisher side: word += 1 (mod 2**32), then signal every armed socket.

        Call it inside the region's critical section.
        """
        buf, at = self.region.buf, self.word_offset
        buf[at : at + 4] = _U32.pack((_U32.unpack_from(buf, at)[0] + 1) & 0xFFFFFFFF)
        self.signal()

    def signal(self) -> None:
        """Take every armed bit and send one datagram to each socket taken.

        Inside the region's critical section (or a C step's stripes, which every
        arming excludes). The C lock steps bump the word themselves and call this.
        """
        buf, armed_at = self.region.buf, self._armed
        armed = buf[armed_at]
        if armed == self._zeros:
            return
        buf[armed_at] = self._zeros
        bits = int.from_bytes(armed, "little")  # bit 8 * node + b: socket b of node
        sends = self._sends
        while bits:
            lowest = bits & -bits
            bits ^= lowest
            index = lowest.bit_length() - 1
            send = sends.get(index)
            if send is not None:
                try:
                    send(b"", socket.MSG_DONTWAIT)
                    continue
                except BlockingIOError:  # its queue is full: readable already
                    continue
                except OSError:  # its peer is gone (or our sender closed): look again
                    pass
            self._send_afresh(index, send)

    def _send_afresh(self, index: int, stale: object) -> None:
        """Find socket ``index`` again (connect to it), and send it its datagram."""
        node, bit = divmod(index, SOCKETS_PER_NODE)
        try:
            if self.region.shared:
                send = _REGISTRY.sender(self.path(node, bit), stale).send
            else:
                end = _REGISTRY.ends.get((self.identity, node, bit))
                if end is None:
                    return
                send = end.send
            self._sends[index] = send
            send(b"", socket.MSG_DONTWAIT)
        except OSError:  # nobody listens there now, or its queue is full
            self._sends.pop(index, None)

    # -- the watching side (used by Readiness) -----------------------------------------

    def path(self, node: int, bit: int) -> str:
        """The file a shared channel's socket ``bit`` of ``node`` is bound to."""
        return f"{SHM_DIR}/{self.identity}.n{node}.b{bit}"

    def open_socket(self, node: int) -> tuple[socket.socket, int]:
        """A new non-blocking socket watching for ``node``, and its bit (not armed yet).

        Raises:
            InvalidLayout: ``node`` is outside the fleet.
            FleetError: the node has :data:`SOCKETS_PER_NODE` sockets on this channel.
            AccessDenied: another user's file holds the socket's path.
            OSError: the socket cannot be made.
        """
        if not 0 <= node < self.capacity:
            raise InvalidLayout(f"readiness node {node} is outside the fleet ({self.capacity})")
        bit = self._take_bit(node)
        try:
            if self.region.shared:
                sock = self._bound(self.path(node, bit))
            else:
                sock, end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
                _REGISTRY.ends[(self.identity, node, bit)] = end
            sock.setblocking(False)
        except BaseException:
            self._give_bit(node, bit)
            raise
        return sock, bit

    def close_socket(self, sock: socket.socket, node: int, bit: int) -> None:
        """Close a socket of :meth:`open_socket` and give its bit back; idempotent.

        The armed bit may stay set: the next publish takes it and finds no socket.
        """
        if self.region.shared:  # the node is ours: nobody else binds this path meanwhile
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(node, bit))
        else:
            end = _REGISTRY.ends.pop((self.identity, node, bit), None)
            if end is not None:
                end.close()
        sock.close()
        self._give_bit(node, bit)

    def arm(self, node: int, bit: int) -> None:
        """Set ``bit`` in ``node``'s armed byte, inside the region's critical section.

        Raises:
            FleetError: the region is closed (or its section failed).
        """
        region = self.region
        region.acquire()
        try:
            at = self.armed_offset + node
            region.buf[at] |= 1 << bit
        finally:
            region.release()

    def _take_bit(self, node: int) -> int:
        with _REGISTRY.lock:
            used = _REGISTRY.bits.setdefault((self.identity, node), set())
            for bit in range(SOCKETS_PER_NODE):
                if bit not in used:
                    used.add(bit)
                    return bit
        raise FleetError(
            f"readiness {self.identity!r}: node {node} watches it with "
            f"{SOCKETS_PER_NODE} descriptors already (close one first)",
            node=node,
        )

    def _give_bit(self, node: int, bit: int) -> None:
        with _REGISTRY.lock:
            _REGISTRY.bits.get((self.identity, node), set()).discard(bit)

    @staticmethod
    def _bound(path: str) -> socket.socket:
        """A datagram socket bound to ``path`` (mode 0600), replacing our own stale file."""
        if len(path.encode()) > _PATH_MAX:
            raise FleetError(f"readiness socket path {path!r} is longer than {_PATH_MAX} bytes")
        with contextlib.suppress(FileNotFoundError):
            info = os.lstat(path)
            if info.st_uid != euid() or not stat.S_ISSOCK(info.st_mode):
                raise AccessDenied(
                    f"{path!r} is not a socket of uid {euid()} (uid {info.st_uid}); refusing it"
                )
            os.unlink(path)  # a socket of a previous process on this node: it is dead
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(path)
            os.chmod(path, 0o600)
        except OSError as error:
            sock.close()
            if error.errno in (errno.EADDRINUSE, errno.EACCES):  # someone else's file now
                raise AccessDenied(f"readiness socket {path!r}: {error.strerror}") from error
            raise
        return sock
