"""The public faces: every api.md name is exported, and public classes say where they live."""

from __future__ import annotations

import pickle

import orbitive.pool
import orbitive.pool.session
from orbitive._errors import OrbitError
from orbitive.pool import Key, Lease, ResourceId

API_NAMES = {
    "Pool", "Key", "Limits", "LocalFirst", "LocalOnly", "Policy", "Incarnation", "LocalReuse",
    "RemoteReuse", "Create", "Wait", "Reject", "Lease", "Execution", "CreationPermit",
    "ResourceId", "Candidate", "StaleError", "BusyError", "DrainingError", "NotOwnerError",
    "NotReservedError", "CreationBudgetError", "KeyFullError", "LaneFullError", "MalformedError",
}  # fmt: skip


def test_every_api_name_is_exported_and_every_export_exists() -> None:
    assert set(orbitive.pool.__all__) >= API_NAMES
    for name in orbitive.pool.__all__:
        assert hasattr(orbitive.pool, name), name
    assert set(orbitive.pool.session.__all__) == {
        "open_session", "accept_session", "open_session_async", "accept_session_async",
    }  # fmt: skip


def test_public_classes_name_their_public_module() -> None:
    for name in orbitive.pool.__all__:
        obj = getattr(orbitive.pool, name)
        if isinstance(obj, type) and obj.__name__ != "LayoutMismatch":
            assert obj.__module__ == "orbitive.pool", name


def test_pool_errors_carry_data_and_survive_pickling() -> None:
    rid = ResourceId(247, 1, 2, 3, 4)
    for name in ("StaleError", "BusyError", "NotReservedError", "MalformedError"):
        cls = getattr(orbitive.pool, name)
        assert issubclass(cls, OrbitError)
        error = cls(f"resource {rid} says {name}", node=1, key=rid)
        copy = pickle.loads(pickle.dumps(error))
        assert (type(copy), str(copy), copy.node, copy.key) == (cls, str(error), 1, rid)


def test_value_types_are_frozen_plain_data() -> None:
    lease = Lease(ResourceId(247, 1, 2, 3, 4), 5, 1, 9)
    assert pickle.loads(pickle.dumps(lease)) == lease
    assert str(lease.id) == f"247:1:{3 << 16 | 2}"
    assert ResourceId.from_raw(lease.id.raw, 4) == lease.id
    assert Key.from_bytes((5).to_bytes(16, "little")) == Key(5)
    assert Key.digest(b"a") == Key.digest(b"a") != Key.digest(b"b")
