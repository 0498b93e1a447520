"""Transaction mode's decisions for a client connection, against what PostgreSQL keeps.

The framing of :mod:`orbitive.clients._wire` is tested on bytes. The decisions of
:class:`~orbitive.clients._client_state.ClientState` are tested on real sessions:
psycopg runs each scenario through :class:`._deciding_relay.DecidingRelay`, which
decides as the router will and asks the server, after every transaction, what its
session keeps. A transaction may release its connection exactly when the server says
the session keeps nothing of it.
"""

from __future__ import annotations

import itertools

import psycopg
import pytest

from orbitive.clients import InvalidPoolOptions, _wire
from orbitive.clients._client_state import ClientState, Outcome, settings_check
from orbitive.clients._wire import Framer, Message
from orbitive.pool import MalformedError
from orbitive.pool.session import SessionClosed

from .._servers import TempPostgres
from ._deciding_relay import DecidingRelay

RELEASE, PINNED = Outcome.RELEASE, Outcome.PINNED
#: In a scenario's statements: the driver's ``commit()``, not a statement.
COMMIT = "commit()"


def _stream() -> tuple[bytes, list[Message]]:
    messages = [
        Message(_wire.ROW_DESCRIPTION, b"\x00\x00"),
        Message(_wire.DATA_ROW, b"x" * 300),
        Message(_wire.COMMAND_COMPLETE, b"SELECT 1\0"),
        Message(_wire.READY_FOR_QUERY, b"I"),
    ]
    return b"".join(message.frame() for message in messages), messages


def test_the_framer_gives_the_same_messages_however_the_stream_is_cut() -> None:
    data, messages = _stream()
    for cut in range(len(data) + 1):
        framer = Framer(_wire.BACKEND)
        assert framer.feed(data[:cut]) + framer.feed(data[cut:]) == messages
        framer.end()
    framer = Framer(_wire.BACKEND)
    assert list(itertools.chain.from_iterable(framer.feed(bytes([b])) for b in data)) == messages


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"Q\x00\x00\x00\x03", "length 3 is outside"),
        (b"Q\xff\xff\xff\xff", "length 4294967295 is outside"),
        (b"Q\x40\x00\x00\x03", "is outside 4 to"),  # PostgreSQL's limit and 1 byte
        (b"p\x00\x00\x00\x08pass", "type 0x70 is not allowed"),  # a password, after the startup
        (b"\x00\x00\x00\x00\x08", "type 0x00 is not allowed"),  # a startup packet, after it
    ],
    ids=["length under 4", "length of 4 GiB", "over MESSAGE_MAX", "password", "startup"],
)
def test_the_framer_refuses_a_bad_header_before_buffering_its_body(data: bytes, says: str) -> None:
    framer = Framer(_wire.FRONTEND)
    with pytest.raises(MalformedError, match=says):
        framer.feed(data)
    with pytest.raises(MalformedError, match="broke at an earlier message"):
        framer.feed(_wire.query(b"SELECT 1").frame())


def test_a_stream_that_ends_inside_a_message_is_closed_not_complete() -> None:
    data, _ = _stream()
    framer = Framer(_wire.BACKEND)
    framer.feed(data[:-1])
    with pytest.raises(SessionClosed, match="inside a message"):
        framer.end()


@pytest.mark.parametrize(
    ("reader", "body"),
    [
        (_wire.ready_status, b"X"),
        (_wire.ready_status, b""),
        (_wire.command_status, b"SELECT 1"),
        (_wire.command_status, b"SELECT 1\0junk"),
        (_wire.parameter_status, b"TimeZone\0"),
        (_wire.error_fields, b"CXX000\0"),
        (_wire.parse_statement, b"s\0SELECT $1\0\x00\x02\x00\x00\x00\x17"),
        (_wire.target, b"X\0"),
        (_wire.target, b"Sname"),
    ],
)
def test_a_field_reader_names_a_malformed_body(reader: object, body: bytes) -> None:
    with pytest.raises(MalformedError):
        reader(body)  # type: ignore[operator]


def test_a_tracked_setting_name_must_be_a_name() -> None:
    with pytest.raises(InvalidPoolOptions, match="not a setting's name"):
        settings_check(frozenset({b"TimeZone') OR true --"}))


def test_a_refusal_held_inside_a_block_pins_and_passes_every_answer_on() -> None:
    """A refusable statement first in a span that turns out to be a block cannot be
    refused (the block's other statements ran): its answers all reach the client."""
    state = ClientState(refuse=True)
    state.from_client(_wire.query(b"LISTEN a; BEGIN"))
    assert state.from_server(Message(_wire.COMMAND_COMPLETE, b"LISTEN\0")) == (Outcome.CONTINUE, [])
    begin = Message(_wire.COMMAND_COMPLETE, b"BEGIN\0")
    assert state.from_server(begin) == (Outcome.CONTINUE, [])
    ready = _wire.ready_for_query(_wire.IN_BLOCK)
    outcome, out = state.from_server(ready)
    assert outcome is Outcome.CONTINUE
    assert out == [Message(_wire.COMMAND_COMPLETE, b"LISTEN\0"), begin, ready]
    assert state.pins == {"LISTEN"}


def _through_relay(
    server: TempPostgres, statements: list[str], *, autocommit: bool = True, refuse: bool = False
) -> DecidingRelay:
    relay = DecidingRelay(("127.0.0.1", server.port), refuse=refuse)
    with psycopg.connect(relay.conninfo(), autocommit=autocommit) as conn:
        for statement in statements:
            if statement == COMMIT:
                conn.commit()
            else:
                conn.execute(statement)
    relay.join()
    return relay


SCENARIOS = {
    "plain reads": (["SELECT 1", "SELECT now()", "VALUES (1), (2)"], [RELEASE] * 3),
    "an empty statement": ([""], [RELEASE]),
    "a block": (["BEGIN", "SELECT 1", "COMMIT"], [RELEASE]),
    "a savepoint rolled back": (
        ["BEGIN", "SELECT 1", "SAVEPOINT s", "ROLLBACK TO s", "ROLLBACK"],
        [RELEASE],
    ),
    "SET LOCAL in a block": (["BEGIN", "SET LOCAL work_mem = '8MB'", "COMMIT"], [RELEASE]),
    "SET": (["SET work_mem = '8MB'", "RESET work_mem", "SELECT 1"], [PINNED, RELEASE, RELEASE]),
    "a setting set back to its value": (
        ["SET enable_seqscan = off", "SET enable_seqscan = on"],
        [PINNED, RELEASE],
    ),
    "a tracked SET": (["SET TimeZone = 'UTC'", "SET application_name = 'x'"], [RELEASE] * 2),
    "set_config, session and local": (
        [
            "SELECT set_config('work_mem', '9MB', true)",
            "SELECT set_config('work_mem', '9MB', false)",
        ],
        [RELEASE, PINNED],
    ),
    "a session advisory lock, then its unlock": (
        ["SELECT pg_advisory_lock(7)", "SELECT 1", "SELECT pg_advisory_unlock(7)"],
        [PINNED, PINNED, RELEASE],
    ),
    "a transaction advisory lock": (["SELECT pg_advisory_xact_lock(7)"], [RELEASE]),
    "a temporary table, then its drop": (
        ["CREATE TEMP TABLE t (x int)", "INSERT INTO t VALUES (1)", "DROP TABLE t"],
        [PINNED, PINNED, RELEASE],
    ),
    "a temporary table dropped on commit": (
        ["BEGIN", "CREATE TEMPORARY TABLE t (x int) ON COMMIT DROP", "COMMIT"],
        [RELEASE],
    ),
    "SELECT INTO a temporary table": (["SELECT 1 AS x INTO TEMP t2"], [PINNED]),
    "a holdable cursor, then its close": (
        ["DECLARE c CURSOR WITH HOLD FOR SELECT 1", "FETCH c", "CLOSE c"],
        [PINNED, PINNED, RELEASE],
    ),
    "a cursor inside a block": (["BEGIN", "DECLARE c CURSOR FOR SELECT 1", "COMMIT"], [RELEASE]),
    "LISTEN": (["LISTEN news", "SELECT 1"], [PINNED, PINNED]),
    "SQL PREPARE": (["PREPARE p AS SELECT 1", "EXECUTE p"], [PINNED, PINNED]),
    "DISCARD ALL ends every pin": (
        ["LISTEN news", "SELECT pg_advisory_lock(8)", "DISCARD ALL", "SELECT 1"],
        [PINNED, PINNED, RELEASE, RELEASE],
    ),
}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=list(SCENARIOS))
def test_a_connection_is_released_exactly_when_the_session_keeps_nothing(
    postgres_server: TempPostgres, scenario: str
) -> None:
    statements, outcomes = SCENARIOS[scenario]
    relay = _through_relay(postgres_server, statements)
    assert [end.outcome for end in relay.ends] == outcomes
    for end in relay.ends:
        assert (end.outcome is RELEASE) == (not end.kept), end


def test_a_driver_transaction_holds_the_connection_until_its_commit(
    postgres_server: TempPostgres,
) -> None:
    """psycopg outside autocommit opens a block with its first statement; the connection
    stays bound across statements until ``commit()``."""
    relay = _through_relay(
        postgres_server,
        ["SELECT 1", "SELECT 2", COMMIT, "CREATE TEMP TABLE t (x int)", COMMIT],
        autocommit=False,
    )
    assert [end.outcome for end in relay.ends] == [RELEASE, PINNED]
    assert relay.ends[1].kept == {"temporary"}


@pytest.mark.parametrize(
    "statement",
    ["LISTEN news", "PREPARE p AS SELECT 1", "DECLARE c CURSOR WITH HOLD FOR SELECT 1"],
)
def test_a_statement_that_would_pin_is_refused_with_the_drivers_own_error(
    postgres_server: TempPostgres, statement: str
) -> None:
    relay = DecidingRelay(("127.0.0.1", postgres_server.port), refuse=True)
    with psycopg.connect(relay.conninfo(), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="mode='session'") as caught:
            conn.execute(statement)
        assert caught.value.sqlstate == "0A000"
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the connection goes on
    relay.join()
    assert [end.outcome for end in relay.ends] == [Outcome.REFUSE, RELEASE]
    assert all(not end.kept for end in relay.ends)


def test_a_refusable_statement_in_a_multi_statement_query_pins_instead(
    postgres_server: TempPostgres,
) -> None:
    relay = _through_relay(postgres_server, ["SELECT 1; LISTEN news"], refuse=True)
    assert [(end.outcome, end.pins) for end in relay.ends] == [(PINNED, frozenset({"LISTEN"}))]


def test_the_tracked_settings_the_server_reports_are_recorded(
    postgres_server: TempPostgres,
) -> None:
    relay = _through_relay(
        postgres_server, ["SET TimeZone = 'Asia/Tokyo'", "SET DateStyle = 'German'"]
    )
    assert relay.state.settings[b"TimeZone"] == b"Asia/Tokyo"
    assert relay.state.settings[b"DateStyle"].startswith(b"German")


def test_a_pinned_client_is_never_refused_since_the_undo_would_end_its_other_state(
    postgres_server: TempPostgres,
) -> None:
    relay = _through_relay(
        postgres_server,
        ["SELECT pg_advisory_lock(9)", "LISTEN news", "SELECT pg_advisory_unlock(9)"],
        refuse=True,
    )
    assert [(end.outcome, end.pins) for end in relay.ends] == [
        (PINNED, frozenset({"state"})),
        (PINNED, frozenset({"state", "LISTEN"})),
        (PINNED, frozenset({"LISTEN"})),
    ]
    assert relay.ends[1].kept == {"advisory", "listening"}
