"""The client pool's options, validated once, and the key a pool is built on (and its label)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, cast, final
from urllib.parse import urlsplit

from .._core._bytes import exact_bytes
from .._core._errors import InvalidPoolOptions, MalformedError, shown
from ..pool import Key
from ..pool._layout import LABEL_MAX
from ..pool._values import check_label

#: The longest duration an option takes, in seconds (about 31.7 years).
SECONDS_MAX: Final = 1e9
#: Seconds an idle client stays with its owner while another process waits at max_live.
HANDOFF_GRACE_S: Final = 0.05
#: The largest size an option takes (a u32 table counter).
SIZE_MAX: Final = (1 << 32) - 1
#: ``PoolOptions.mode``'s words.
MODES: Final = ("session", "transaction")
#: ``PoolOptions.on_session_state``'s words.
ON_SESSION_STATE: Final = ("pin", "refuse")


def _size(name: str, value: object, low: int) -> int:
    if type(value) is not int or not low <= value <= SIZE_MAX:
        raise InvalidPoolOptions(
            f"{name} must be an int in {low}..{SIZE_MAX}, got {shown(value)}", key=name
        )
    return value


def _seconds(name: str, value: object) -> float:
    if type(value) is not int and type(value) is not float:
        raise InvalidPoolOptions(f"{name} must be seconds as a float, got {shown(value)}", key=name)
    try:
        seconds = float(value)
    except OverflowError:  # an int past the float range
        seconds = math.inf
    if not 0.0 < seconds <= SECONDS_MAX:  # also false for NaN
        raise InvalidPoolOptions(
            f"{name} must be finite seconds in (0, {SECONDS_MAX:g}], got {shown(value)}", key=name
        )
    return seconds


@final
@dataclass(frozen=True, slots=True)
class PoolOptions:
    """How many clients a key may have, host-wide, and how long they live.

    ``max_live``, ``min_idle`` and ``max_idle`` are fleet-wide values: every
    process of the fleet counts against the same numbers, so 8 workers with
    ``max_live=4`` open at most 4 clients between them, not 32.

    Args:
        max_live: clients alive at once across the fleet (in use, idle or being
            created), an int >= 1.
        min_idle: a warm floor the processes refill between them, each claiming
            only its share of the deficit; 0..max_idle.
        max_idle: idle clients kept across the fleet; a finished client beyond
            it is closed. min_idle..max_live; None means ``max_live``.
        max_waiting: callers of *this process* that may wait at ``max_live`` at
            once; one more gets :class:`~orbitive.clients.TooManyRequests`. >= 1.
        acquire_timeout: seconds a checkout waits at most (float, > 0).
        idle_timeout: seconds an idle client may stay idle (above the
            ``min_idle`` floor), float > 0.
        max_lifetime: seconds after creation when a client is closed once it
            is next idle, float > 0.
        handoff_after: a client's turn, in seconds (float > 0): while another
            process waits at ``max_live``, a client younger than this still
            serves the checkouts of its own process; once older, it is handed
            over (closed, so the waiter can create) when next returned. An
            idle one is handed over within :data:`HANDOFF_GRACE_S` all the
            same. Shorter is fairer (a waiter waits about one turn); longer
            amortises a new connection over more requests, and keeps the
            requests that wait a whole turn rarer (at saturation, about
            ``max_live`` of them per turn). Being a time, the turn bounds the
            wait whatever a request takes.
        handoff_uses: also end a turn after this many checkouts (an int >= 1),
            or None: only ``handoff_after`` does. 1 hands over at once.
        mode: ``"session"`` (a connection stays with its process; the default) or
            ``"transaction"`` (PostgreSQL adapters: a driver's connection goes to
            its process's router, which runs each transaction on an idle server
            connection of any process of the fleet; docs/architecture.md,
            "Transaction mode"). ``max_live``, ``min_idle`` and ``max_idle`` then
            count server connections. The psycopg pools take it so far.
        on_session_state: in transaction mode, what a statement that leaves state
            in the session (``LISTEN``, SQL ``PREPARE``, ``LOAD``, a holdable
            cursor) does when it runs alone: ``"pin"`` (the default: the server
            connection stays with the client while the state lasts) or
            ``"refuse"`` (it is undone and answered SQLSTATE 0A000).

    Raises:
        InvalidPoolOptions: a size is not an int in range (bools refused), the
            sizes break ``min_idle <= max_idle <= max_live``, a duration is not a
            finite number of seconds above zero (at most 1e9), or ``mode`` or
            ``on_session_state`` is not one of its words.
    """

    max_live: int = 4
    min_idle: int = 0
    max_idle: int | None = None
    max_waiting: int = 1024
    acquire_timeout: float = 30.0
    idle_timeout: float = 600.0
    max_lifetime: float = 3600.0
    handoff_after: float = 0.5
    handoff_uses: int | None = None
    mode: str = "session"
    on_session_state: str = "pin"

    def __post_init__(self) -> None:
        max_live = _size("max_live", self.max_live, 1)
        min_idle = _size("min_idle", self.min_idle, 0)
        max_idle = max_live if self.max_idle is None else _size("max_idle", self.max_idle, 0)
        _size("max_waiting", self.max_waiting, 1)
        if self.handoff_uses is not None:
            _size("handoff_uses", self.handoff_uses, 1)
        if not min_idle <= max_idle <= max_live:
            raise InvalidPoolOptions(
                f"options must satisfy min_idle <= max_idle <= max_live, got "
                f"min_idle={min_idle}, max_idle={max_idle}, max_live={max_live}",
                key="max_idle",
            )
        object.__setattr__(self, "max_idle", max_idle)
        for name, words in (("mode", MODES), ("on_session_state", ON_SESSION_STATE)):
            if type(getattr(self, name)) is not str or getattr(self, name) not in words:
                raise InvalidPoolOptions(
                    f"{name} must be one of {', '.join(map(repr, words))}, "
                    f"got {shown(getattr(self, name))}",
                    key=name,
                )
        for name in ("acquire_timeout", "idle_timeout", "max_lifetime", "handoff_after"):
            object.__setattr__(self, name, _seconds(name, getattr(self, name)))

    @property
    def idle_limit(self) -> int:
        """``max_idle`` as an int (it is never None once built)."""
        return self.max_live if self.max_idle is None else self.max_idle


def pool_key(key: object) -> Key:
    """A pool :class:`~orbitive.pool.Key` from a Key, or the digest of bytes or a str.

    Raises:
        InvalidPoolOptions: anything else, or empty bytes or text.
    """
    if type(key) is Key:
        return key
    raw: bytes | None
    if issubclass(type(key), str):  # type(), not isinstance: __class__ may lie
        try:
            raw = str.__str__(cast(str, key)).encode("utf-8")  # its own encode is not called
        except UnicodeEncodeError:
            raise InvalidPoolOptions(
                f"key {shown(key)} is not encodable text (a lone surrogate)", key="key"
            ) from None
    else:
        raw = exact_bytes(key)
    if raw:
        return Key.digest(raw)
    raise InvalidPoolOptions(
        f"key must be a Key, or non-empty bytes or str to digest, got {shown(key)}", key="key"
    )


def key_label(key: object, label: object) -> str:
    """The label a pool gives its key: ``label``, else one read from a str key, else "".

    A str key that is a URL shows as ``scheme://user@host:port/path`` (no password,
    query or fragment); one without ``=``, ``@`` or white space (a name) shows as it
    is; any other (a ``key=value`` string may hold a password) gives no label, nor
    does a bytes or :class:`~orbitive.pool.Key` key.

    Raises:
        InvalidPoolOptions: ``label`` is not None and breaks the label rule (1..127
            bytes of UTF-8 without control characters).
    """
    if label is not None:
        try:
            check_label(label)
        except MalformedError as error:
            raise InvalidPoolOptions(error.message, key="label") from None
        return str.__str__(cast(str, label))
    if not issubclass(type(key), str):
        return ""
    text = str.__str__(cast(str, key))
    if "://" in text:
        try:
            parts = urlsplit(text)
            port = parts.port
        except ValueError:  # not a URL after all
            return ""
        user = f"{parts.username}@" if parts.username else ""
        host = f"{parts.hostname or ''}{f':{port}' if port else ''}"
        return printable_label(f"{parts.scheme}://{user}{host}{parts.path}")
    if any(c in text for c in "=@") or any(c.isspace() for c in text):
        return ""
    return printable_label(text)


def printable_label(text: str) -> str:
    """``text`` as a key label: control characters and lone surrogates as ``?``, at most
    127 bytes of UTF-8 (cut on a character, ending in ``…``)."""
    clean = "".join(
        "?" if ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F or 0xD800 <= ord(c) <= 0xDFFF else c
        for c in text
    )
    if len(clean.encode()) <= LABEL_MAX:
        return clean or "?"
    cut = clean.encode()[: LABEL_MAX - len("…".encode())].decode(errors="ignore")
    return cut + "…"


def seconds(name: str, value: object) -> float:
    """``value`` as float seconds above zero, for a per-call timeout.

    Raises:
        InvalidPoolOptions: not finite seconds in (0, 1e9].
    """
    return _seconds(name, value)
