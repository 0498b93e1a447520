"""Regressions: each odd argument users reported (issue 10, item 4) raises its named error.

Before, these raised OverflowError, UnicodeEncodeError, ValueError, TypeError,
AttributeError or whatever a hostile hook raised, or (``Key.digest(3)``)
returned a key of three zero bytes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orbitive import (
    Fleet,
    InvalidArgumentType,
    InvalidCapacity,
    InvalidName,
    NodeOutsideFleet,
    OrbitError,
)
from orbitive._core._clock import check_ttl
from orbitive._core._errors import InvalidTtl, shown
from orbitive.lock import (
    Acquired,
    EntryTooLarge,
    Fence,
    InvalidEncoding,
    LockKey,
    LockLayout,
    LockLease,
    LockOwner,
    LockTable,
)
from orbitive.pool import Key, MalformedError, Pool, ResourceId
from orbitive.store import (
    ErrorKind,
    InvalidLockTtl,
    InvalidStoreUrl,
    Store,
    StoreError,
    _url,
    open_store,
)

from .._odd import HostileObject, RaisingFloat, RaisingInt, RaisingStr, released_view

HUGE = 10**400
KEY = LockKey("odd", "key")
OWNER = LockOwner(b"odd-owner")


@pytest.fixture
def local_table(fleet_name: str) -> Iterator[LockTable]:
    with Fleet.local(fleet_name, 2) as fleet:
        table = LockTable(fleet)
        yield table
        table.close()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite://{tmp_path}/odd.db") as store:
        yield store


# -- durations ------------------------------------------------------------------------


def table_verbs(table: LockTable) -> list[Callable[[Any], object]]:
    """try_acquire, renew and renew_owned of ``table``, each taking only a ttl."""
    lease = table.try_acquire(KEY, OWNER, 30.0).lease
    return [
        lambda ttl: table.try_acquire(LockKey("odd", "other"), OWNER, ttl),
        lambda ttl: table.renew(lease, ttl),
        lambda ttl: table.renew_owned(KEY, OWNER, ttl),
    ]


@pytest.mark.parametrize("ttl", [HUGE, -HUGE, 10**5000, RaisingFloat(-1.0)], ids=shown)
def test_a_ttl_out_of_range_is_invalid_ttl_on_every_table_verb(
    local_table: LockTable, ttl: object
) -> None:
    before = local_table.statistics()
    for verb in table_verbs(local_table):
        with pytest.raises(InvalidTtl):
            verb(ttl)
    after = local_table.statistics()
    assert after.last_state_revision == before.last_state_revision + 1  # table_verbs' acquire


def test_a_float_subclass_counts_by_its_value_and_its_hooks_never_run(
    local_table: LockTable,
) -> None:
    renew, owned = table_verbs(local_table)[1:]
    result = local_table.try_acquire(LockKey("odd", "subclass"), OWNER, RaisingFloat(30.0))
    assert isinstance(result, Acquired)
    assert 29.0 < result.lease.remaining() <= 30.0
    renewed = renew(RaisingFloat(20.0))
    assert isinstance(renewed, LockLease) and 19.0 < renewed.remaining() <= 20.0
    assert owned(RaisingInt(10)) is not None
    assert check_ttl(RaisingInt(7)) == 7.0 and type(check_ttl(RaisingFloat(2.5))) is float


def test_the_exact_float_fast_path_returns_the_value_itself() -> None:
    ttl = 12.5
    assert check_ttl(ttl) is ttl


@pytest.mark.parametrize("ttl", [HUGE, RaisingFloat(float("nan"))], ids=shown)
def test_a_store_ttl_out_of_range_is_the_duration_guard(sqlite_store: Store, ttl: object) -> None:
    with pytest.raises(InvalidLockTtl) as caught:
        sqlite_store.try_lock("odd", "owner", ttl)  # type: ignore[arg-type]
    assert caught.value.kind is ErrorKind.DATABASE and isinstance(caught.value, StoreError)
    assert isinstance(caught.value.__cause__, InvalidTtl)
    lock = sqlite_store.try_lock("odd", "owner", 30.0)
    assert lock is not None
    with pytest.raises(InvalidLockTtl):
        lock.renew(ttl)  # type: ignore[arg-type]
    with pytest.raises(InvalidLockTtl):
        sqlite_store.lock("odd-2", ttl=ttl)  # type: ignore[arg-type]
    with pytest.raises(InvalidTtl):
        sqlite_store.lock("odd-2", ttl=1.0, timeout=ttl)  # type: ignore[arg-type]
    assert not lock.lost and [info.name for info in sqlite_store.locks()] == ["odd"]


def test_a_timeout_float_subclass_of_zero_makes_one_attempt(sqlite_store: Store) -> None:
    held = sqlite_store.try_lock("odd", "someone", 30.0)
    assert held is not None
    started = time.monotonic()
    with pytest.raises(OrbitError, match="still held"):
        sqlite_store.lock("odd", ttl=1.0, timeout=RaisingFloat(0.0))
    assert time.monotonic() - started < 5.0


# -- key parts, owners, names and paths -------------------------------------------------


@pytest.mark.parametrize("text", ["\ud800", "a\udfffb"], ids=ascii)
def test_a_lone_surrogate_in_a_key_or_owner_is_invalid_encoding(text: str) -> None:
    for build in (lambda: LockKey(text, "y"), lambda: LockKey("x", text), lambda: LockOwner(text)):
        with pytest.raises(InvalidEncoding) as caught:
            build()
        assert isinstance(caught.value, ValueError)


def test_a_lone_surrogate_in_a_table_owner_is_refused_before_the_table(
    local_table: LockTable,
) -> None:
    with pytest.raises(InvalidEncoding):
        local_table.try_acquire(KEY, "\ud800", 30.0)
    assert local_table.leases() == []


@pytest.mark.parametrize(
    "url",
    ["sqlite:///tmp/\ud800.db", "sqlite:rel\udfff.db", "postgresql://\ud800@127.0.0.1:1/x"],
    ids=ascii,
)
def test_a_lone_surrogate_in_a_store_url_is_invalid_store_url(url: str) -> None:
    with pytest.raises(InvalidStoreUrl):
        open_store(url)


def test_a_surrogate_escaped_path_byte_is_a_usable_sqlite_path(tmp_path: Path) -> None:
    with open_store(f"sqlite://{tmp_path}/raw\udcff.db") as store:
        assert store.try_lock("odd", "owner", 30.0) is not None
    assert os.path.exists(os.fsencode(tmp_path) + b"/raw\xff.db")  # the byte itself


def test_an_unsplittable_shm_url_is_invalid_store_url() -> None:
    with pytest.raises(InvalidStoreUrl):
        open_store("shm://[::1")


def test_a_url_urllib_cannot_split_is_shown_without_any_part() -> None:
    assert _url._redacted("postgresql://u:pw]x@h/db") == "postgresql://***"


def test_a_namespace_no_layout_holds_is_entry_too_large() -> None:
    with pytest.raises(EntryTooLarge):
        LockKey("x" * 65536, "y")
    assert len(LockKey("x" * 65535, "y").namespace) == 65535


def test_a_released_memoryview_is_a_named_error_everywhere() -> None:
    with pytest.raises(InvalidArgumentType):
        LockKey(released_view(), "y")
    with pytest.raises(InvalidArgumentType):
        LockOwner(released_view())
    with pytest.raises(MalformedError):
        Key.digest(released_view())
    with pytest.raises(MalformedError):
        Key.from_bytes(released_view())


def test_str_and_bytes_subclasses_are_read_by_their_contents() -> None:
    class Raw(bytes):
        def __bytes__(self) -> bytes:
            raise RuntimeError("never called")

    key = LockKey(RaisingStr("odd"), Raw(b"key"))
    assert key == KEY and type(key.namespace) is bytes and type(key.label) is bytes
    assert LockOwner(Raw(b"odd-owner")) == OWNER


def test_lock_key_of_a_value_without_namespace_is_invalid_argument_type() -> None:
    for typ in (object(), HostileObject()):
        with pytest.raises(InvalidArgumentType) as caught:
            LockKey.of(typ, "label")  # type: ignore[arg-type]
        assert caught.value.__cause__ is not None


def test_a_fence_high_water_that_is_not_an_int_is_invalid_argument_type() -> None:
    with pytest.raises(InvalidArgumentType):
        Fence("10")  # type: ignore[arg-type]


# -- pool keys and ids --------------------------------------------------------------------


@pytest.mark.parametrize("data", ["text", -1, 3, None, [1, 2]], ids=repr)
def test_key_digest_takes_only_bytes(data: Any) -> None:
    with pytest.raises(MalformedError):
        Key.digest(data)


def test_key_digest_of_bytes_likes_agree() -> None:
    assert Key.digest(b"abc") == Key.digest(bytearray(b"abc")) == Key.digest(memoryview(b"abc"))


@pytest.mark.parametrize("rid", [10**5000, HostileObject(), "247:0:1"], ids=shown)
def test_pool_resource_verbs_refuse_a_non_id_before_the_table(fleet_name: str, rid: Any) -> None:
    with Fleet.local(fleet_name, 2) as fleet, Pool(fleet, key_capacity=8, lane_capacity=8) as pool:
        for verb in (pool.reserve, pool.drain, pool.unregister):
            with pytest.raises(MalformedError):
                verb(rid)
        with pytest.raises(MalformedError):
            pool.reconcile(rid, 0, 0.0)
        with pytest.raises(MalformedError):
            ResourceId.from_raw(rid, 1)


def test_a_huge_int_key_shows_its_width_in_the_message() -> None:
    with pytest.raises(MalformedError, match="int of 16610 bits"):
        Key(10**5000)


# -- the store's blocking helper ----------------------------------------------------------


@pytest.mark.parametrize("kwargs", [{"auto_renew": "yes"}, {"on_lost": 5}], ids=repr)
def test_lock_checks_auto_renew_and_on_lost_before_any_attempt(
    sqlite_store: Store, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(InvalidArgumentType):
        sqlite_store.lock("odd", ttl=1.0, timeout=0, **kwargs)
    assert sqlite_store.locks() == [] and sqlite_store.statistics().busy_count == 0


# -- messages -----------------------------------------------------------------------------


def test_shown_never_raises_and_stays_short() -> None:
    assert shown(10**5000) == "an int of 16610 bits"
    assert shown(-(10**400)) == "a negative int of 1329 bits"
    assert shown(HostileObject()) == "<HostileObject object>"
    assert shown(RaisingInt(5)) == "<RaisingInt object>"
    assert shown(2**64) == str(2**64) and shown(1.5) == "1.5"
    assert len(shown("x" * 1000)) == 60 and shown("x" * 1000).endswith("...")


# -- cases for the lead's files -----------------------------------------------------------


@pytest.mark.parametrize("layout", [1, "layout", HostileObject()], ids=shown)
def test_a_layout_that_is_not_a_lock_layout_is_invalid_argument_type(
    fleet_name: str, layout: Any
) -> None:
    with Fleet.local(fleet_name, 2) as fleet, pytest.raises(InvalidArgumentType):
        LockTable(fleet, layout=layout)


def test_a_fleet_that_is_not_a_fleet_is_invalid_argument_type() -> None:
    with pytest.raises(InvalidArgumentType):
        LockTable(None)  # type: ignore[arg-type]


def test_a_lease_slot_that_is_not_an_int_is_invalid_argument_type(
    local_table: LockTable,
) -> None:
    lease = local_table.try_acquire(KEY, OWNER, 30.0).lease
    with pytest.raises(InvalidArgumentType):
        local_table.renew(lease._replace(slot=RaisingInt(lease.slot)), 30.0)


def test_a_layout_of_the_right_type_is_still_accepted(fleet_name: str) -> None:
    with Fleet.local(fleet_name, 2) as fleet:
        table = LockTable(fleet, LockLayout(capacity=16))
        assert table.statistics().capacity == 16


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("odd", 10**5000), InvalidCapacity),
        (("odd", RaisingInt(2)), InvalidCapacity),
        ((RaisingStr("odd"), 2), InvalidName),
        ((HostileObject(), 2), InvalidName),
        (("odd", 2, 10**5000), NodeOutsideFleet),
    ],
    ids=["huge-capacity", "hostile-capacity", "hostile-str-name", "hostile-name", "huge-node"],
)
def test_fleet_arguments_with_hostile_reprs_get_named_errors(
    args: tuple[Any, ...], error: type[OrbitError]
) -> None:
    with pytest.raises(error):
        Fleet.local(*args)


def test_is_alive_of_a_huge_node_is_node_outside_fleet(fleet_name: str) -> None:
    with Fleet.join(fleet_name, 2) as fleet, pytest.raises(NodeOutsideFleet):
        fleet.is_alive(10**5000)
