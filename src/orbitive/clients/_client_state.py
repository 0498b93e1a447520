"""Transaction mode's decisions for one client connection: where a transaction ends,
and what the session keeps of it.

A server connection is bound to a client from the first message of a transaction to
the ``ReadyForQuery`` whose status is idle (``I``); a status of ``T`` or ``E`` keeps it
bound, as PgBouncer's transaction mode does. When the transaction ends, the client
either leaves nothing on the session (the connection goes back to the fleet), or pins
the connection: it keeps something only that client's later statements may see
(docs/architecture.md, "What pins a connection, and how the router sees it").

:class:`ClientState` reads what the router passes between the client and the server
(:mod:`._wire` messages) and decides, without I/O, from:

- the command status of ``CommandComplete``: ``LISTEN``, ``PREPARE`` and ``LOAD`` pin
  at once; ``SET`` and ``RESET`` call for the *settings check*, ``DECLARE CURSOR`` for
  the *state check*;
- the statement texts the client sent, for a few words: ``set_config`` calls for the
  settings check; a session advisory lock (``pg_advisory_lock``,
  ``pg_try_advisory_lock``, their ``_shared`` forms), or ``temp``, ``temporary`` or
  ``pg_temp`` in a statement whose command status is ``CREATE TABLE`` or ``SELECT``,
  for the state check. A pinned client's unlocks, ``CLOSE``, ``DROP`` and ``DISCARD``
  call for the check again, which may unpin it;
- ``ParameterStatus`` of a tracked setting (``TimeZone``, ``DateStyle``...), which is
  recorded, not pinned: the router sets it on the next connection the client gets.

The checks are the router's to run (one statement each, its answers never reaching
the client); :meth:`ClientState.checked` takes their findings. With ``refuse=True``
a statement that would pin, sent alone outside a transaction block, is refused
instead: its answers are held back and replaced by an ``ErrorResponse`` of SQLSTATE
0A000 that names the way out, and the router undoes it with ``DISCARD ALL``.
"""

from __future__ import annotations

import enum
import itertools
import re
from collections.abc import Mapping
from typing import Final, final

from .._core._errors import InvalidPoolOptions
from . import _wire
from ._wire import Message

#: Settings the server reports (``ParameterStatus``) whose client value the router
#: restores on any connection, so that setting one does not pin.
TRACKED: Final = frozenset(
    {
        b"client_encoding",
        b"DateStyle",
        b"IntervalStyle",
        b"TimeZone",
        b"standard_conforming_strings",
        b"application_name",
    }
)
#: Command statuses that pin as soon as they complete, with the cause they pin for.
_PINS_AT_ONCE: Final = {b"LISTEN": "LISTEN", b"PREPARE": "PREPARE", b"LOAD": "LOAD"}
#: What refusing each refusable command status tells the client to do instead.
_WAYS_OUT: Final = {
    b"LISTEN": "listen on a connection of its own",
    b"PREPARE": "use the driver's prepared statements, not SQL PREPARE",
    b"LOAD": "load the library through the server's settings",
    b"DECLARE CURSOR": "declare the cursor inside a transaction, without WITH HOLD",
}
#: Command statuses of statements that may create a temporary object.
_CREATING_STATUSES: Final = frozenset(
    {b"CREATE TABLE", b"CREATE TABLE AS", b"SELECT", b"CREATE VIEW", b"CREATE SEQUENCE"}
    | {b"CREATE FUNCTION", b"CREATE TYPE", b"CREATE DOMAIN", b"CREATE PROCEDURE"}
)
_SET_CONFIG: Final = re.compile(rb"(?i)\bset_config\b")
_ADVISORY: Final = re.compile(rb"(?i)\bpg_(?:try_)?advisory_lock(?:_shared)?\b")
_TEMPORARY: Final = re.compile(rb"(?i)\b(?:temp|temporary|pg_temp)\b")
_SETTING_NAME: Final = re.compile(rb"[A-Za-z0-9_.]{1,63}")
_UNDOING: Final = re.compile(rb"(?i)\b(?:pg_advisory_unlock(?:_all|_shared)?|close|drop|discard)\b")
#: The SQLSTATE of a refused statement: feature_not_supported.
REFUSED_SQLSTATE: Final = "0A000"
#: The state check: one row of three counts, this session's advisory locks, temporary
#: objects (relations, views and sequences, functions, types) and holdable cursors
#: (``bench/txn_hop.py`` measures it).
STATE_CHECK: Final = (
    b"SELECT (SELECT count(*) FROM pg_locks"
    b" WHERE locktype = 'advisory' AND pid = pg_backend_pid()),"
    b" (SELECT count(*) FROM pg_class WHERE relnamespace = pg_my_temp_schema())"
    b" + (SELECT count(*) FROM pg_proc WHERE pronamespace = pg_my_temp_schema())"
    b" + (SELECT count(*) FROM pg_type WHERE typnamespace = pg_my_temp_schema()),"
    b" (SELECT count(*) FROM pg_cursors WHERE is_holdable)"
)


def settings_check(tracked: frozenset[bytes] = TRACKED, role: bytes | None = None) -> bytes:
    """The settings check: one row of one count, the settings this session set (``SET``,
    ``set_config(..., false)``) to another value than a fresh session's (asyncpg sets
    ``jit`` off around its type introspection, then back), other than the ``tracked``
    ones; and a role taken (``SET ROLE``, ``SET SESSION AUTHORIZATION``, which
    ``pg_settings`` does not show): a current user other than the session user, or a
    session user other than ``role``, the one the connection logged in as.

    Raises:
        InvalidPoolOptions: a tracked name that is not 1 to 63 of ``[A-Za-z0-9_.]``.
    """
    for name in tracked:
        if not _SETTING_NAME.fullmatch(name):
            raise InvalidPoolOptions(f"{name!r} is not a setting's name", key="track_settings")
    names = ", ".join(f"'{name.decode('ascii').lower()}'" for name in sorted(tracked))
    check = (
        "SELECT (SELECT count(*) FROM pg_settings WHERE source = 'session'"
        f" AND setting IS DISTINCT FROM reset_val AND lower(name) NOT IN ({names}))"
        " + (current_user <> session_user)::int"
    ).encode()
    if role is not None:
        tag = _dollar_tag(role)
        check += b" + (session_user <> " + tag + role + tag + b")::int"
    return check


def restore_query(wanted: Mapping[bytes, bytes], current: Mapping[bytes, bytes]) -> bytes | None:
    """The statement that gives a server connection a client's tracked settings, or
    ``None`` when they are equal already.

    Args:
        wanted: the client's values (:attr:`ClientState.settings`).
        current: the values the server connection last reported.

    Returns:
        One ``SELECT set_config(...)`` for every setting whose value differs, values
        dollar-quoted (no escape depends on ``standard_conforming_strings``); its
        answers are the router's to swallow, and its ``ParameterStatus`` messages
        bring ``current`` up to date.

    Raises:
        InvalidPoolOptions: a name that is not a setting's name.
    """
    calls = []
    for name, value in sorted(wanted.items()):
        if current.get(name) == value:
            continue
        if not _SETTING_NAME.fullmatch(name):
            raise InvalidPoolOptions(f"{name!r} is not a setting's name", key="track_settings")
        tag = next(
            f"$orb{n}$".encode() for n in itertools.count() if f"$orb{n}".encode() not in value
        )
        calls.append(b"set_config('" + name + b"', " + tag + value + tag + b", false)")
    return b"SELECT " + b", ".join(calls) if calls else None


def _dollar_tag(value: bytes) -> bytes:
    """A dollar-quote tag that does not occur in ``value``."""
    return next(b"$orb%d$" % n for n in itertools.count() if b"$orb%d" % n not in value)


class Outcome(enum.Enum):
    """What the router does with the server connection after a server message."""

    #: The transaction goes on; the connection stays bound to the client.
    CONTINUE = "continue"
    #: The transaction ended and left nothing: the connection goes back to the fleet.
    RELEASE = "release"
    #: It ended, and the session keeps something of this client's: the connection
    #: stays with the client (:attr:`ClientState.pins` says why).
    PINNED = "pinned"
    #: It ended after a trigger: run the checks :attr:`ClientState.checks` names,
    #: then call :meth:`ClientState.checked`.
    CHECK = "check"
    #: A statement was refused (the messages returned say so): run ``DISCARD ALL`` on
    #: the connection, its answers swallowed, before anything else, then release it.
    REFUSE = "refuse"


class Checks(enum.Flag):
    """Which checks a transaction called for."""

    NONE = 0
    #: Advisory locks, temporary tables, holdable cursors of the session.
    STATE = enum.auto()
    #: Settings of the session (``pg_settings`` with ``source = 'session'``) other than
    #: the tracked ones.
    SETTINGS = enum.auto()


@final
class ClientState:
    """The transaction and session state of one client connection, as its messages show.

    Args:
        refuse: refuse a statement that would pin, when it is sent alone outside a
            transaction block by a client not pinned yet (``on_session_state="refuse"``),
            instead of pinning. A refusal cannot undo one piece of a pinned session.
        always_check: run both checks after every transaction
            (``state_check="always"``), for applications whose functions take session
            advisory locks, create temporary tables or set settings by other names.
        tracked: the reported settings restored on every connection instead of pinned.
        reported: the values the client was told at its startup; of these, the
            tracked ones are its settings until the server reports others.
    """

    __slots__ = (
        "_always",
        "_checks",
        "_commands",
        "_held",
        "_refuse",
        "_refusing",
        "_settings",
        "_started_idle",
        "_texts",
        "_tracked",
        "bound",
        "pins",
    )

    def __init__(
        self,
        *,
        refuse: bool = False,
        always_check: bool = False,
        tracked: frozenset[bytes] = TRACKED,
        reported: Mapping[bytes, bytes] | None = None,
    ) -> None:
        self._refuse = refuse
        self._always = always_check
        self._tracked = tracked
        #: A server connection is bound to this client: a transaction runs, or a pin.
        self.bound = False
        #: Why the session keeps this client's connection (``"LISTEN"``, ``"state"``...).
        self.pins: frozenset[str] = frozenset()
        #: The tracked settings this client set, by name, as the server reported them.
        self._settings = {
            name: value for name, value in (reported or {}).items() if name in tracked
        }
        self._texts: list[bytes] = []
        self._checks = Checks.NONE
        self._commands = 0
        self._refusing: bytes | None = None
        self._held: list[Message] = []
        self._started_idle = True  # the last ReadyForQuery said idle

    @property
    def settings(self) -> dict[bytes, bytes]:
        """The tracked settings the server reported to this client, by name (a copy)."""
        return dict(self._settings)

    @property
    def checks(self) -> Checks:
        """The checks the ended transaction calls for (meaningful after
        :attr:`Outcome.CHECK`)."""
        return self._checks

    def from_client(self, message: Message) -> None:
        """Note a message the client sends on toward the server.

        The first message of a transaction binds the client (:attr:`bound`); the
        router finds it a connection before passing the message on.

        Raises:
            MalformedError: a ``Query`` or ``Parse`` whose text has no terminator.
        """
        self.bound = True
        if message.kind == _wire.QUERY:
            self._texts.append(_wire.cstring(message.body, 0)[0])
        elif message.kind == _wire.PARSE:
            self._texts.append(_wire.parse_statement(message.body)[1])

    def from_server(self, message: Message) -> tuple[Outcome, list[Message]]:
        """Note a server message and say what follows.

        Args:
            message: the next server message on this client's bound connection.

        Returns:
            The outcome, and the messages to pass on to the client now, in order:
            usually ``[message]``; none while a refusal holds the answers back; the
            held ones, or the refusal, when the transaction ends.

        Raises:
            MalformedError: a ``ReadyForQuery``, ``CommandComplete`` or
                ``ParameterStatus`` whose body is not well formed.
        """
        kind = message.kind
        if kind == _wire.READY_FOR_QUERY:
            return self._ready(_wire.ready_status(message.body), message)
        if kind == _wire.PARAMETER_STATUS:
            name, value = _wire.parameter_status(message.body)
            if name in self._tracked:
                self._settings[name] = value
        elif kind == _wire.COMMAND_COMPLETE:
            self._command(_wire.command_name(_wire.command_status(message.body)))
        elif kind == _wire.EMPTY_QUERY_RESPONSE:
            self._commands += 1
        if self._refusing is None:
            return Outcome.CONTINUE, [message]
        self._held.append(message)
        return Outcome.CONTINUE, []

    def checked(self, *, state: bool, settings: bool) -> Outcome:
        """Take the findings of the checks an :attr:`Outcome.CHECK` called for.

        Args:
            state: the state check found an advisory lock, a temporary table or a
                holdable cursor of the session (``False`` when it did not run).
            settings: the settings check found an untracked setting of the session.

        Returns:
            :attr:`Outcome.PINNED` or :attr:`Outcome.RELEASE`.
        """
        found = {cause for cause, seen in (("state", state), ("settings", settings)) if seen}
        self.pins = (self.pins - {"state", "settings"}) | found
        self._checks = Checks.NONE
        return self._end()

    def _command(self, name: bytes) -> None:
        self._commands += 1
        if name in (b"SET", b"RESET"):
            self._checks |= Checks.SETTINGS
        elif name == b"DECLARE CURSOR" or self._creates_temporary(name):
            self._checks |= Checks.STATE
        elif name == b"DISCARD ALL":  # ends all a session keeps but a loaded library
            self.pins &= {"LOAD"}
        if name not in _WAYS_OUT:
            return
        if self._refuse and self._commands == 1 and self._started_idle and not self.pins:
            self._refusing = name  # alone so far: held back until ReadyForQuery says
        elif name in _PINS_AT_ONCE:
            self.pins |= {_PINS_AT_ONCE[name]}

    def _creates_temporary(self, name: bytes) -> bool:
        return name in _CREATING_STATUSES and any(map(_TEMPORARY.search, self._texts))

    def _ready(self, status: int, message: Message) -> tuple[Outcome, list[Message]]:
        refusing, messages = self._refusing, [*self._held, message]
        self._refusing, self._held = None, []
        alone, self._commands = self._commands == 1, 0
        if refusing is not None and status == _wire.IDLE and alone:
            self._texts, self._checks, self.bound = [], Checks.NONE, False
            refusal = _wire.error_response("ERROR", REFUSED_SQLSTATE, _refusal(refusing))
            return Outcome.REFUSE, [refusal, message]
        if refusing in _PINS_AT_ONCE:  # not alone after all: it can only pin
            self.pins |= {_PINS_AT_ONCE[refusing]}
        self._started_idle = status == _wire.IDLE
        if status != _wire.IDLE:
            return Outcome.CONTINUE, messages
        self._note_texts()
        if self._checks:
            return Outcome.CHECK, messages
        return self._end(), messages

    def _note_texts(self) -> None:
        texts, self._texts = self._texts, []
        for text in texts:
            if _SET_CONFIG.search(text):
                self._checks |= Checks.SETTINGS
            if _ADVISORY.search(text):
                self._checks |= Checks.STATE
            if self.pins & {"state", "settings"} and _UNDOING.search(text):
                self._checks |= Checks.STATE | Checks.SETTINGS
        if self._always:
            self._checks |= Checks.STATE | Checks.SETTINGS

    def _end(self) -> Outcome:
        if self.pins:
            return Outcome.PINNED
        self.bound = False
        return Outcome.RELEASE


def _refusal(name: bytes) -> str:
    return (
        f"{name.decode()} outside a transaction block would leave state on a connection"
        f" other clients share (on_session_state='refuse'): {_WAYS_OUT[name]}, or give this"
        " work a pool with mode='session'"
    )
