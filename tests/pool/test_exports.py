"""Pool errors and value types are plain data that cross processes.

(``tests/core/test_exports.py`` checks the exported names and their ``__module__``.)
"""

from __future__ import annotations

import pickle

import orbitive.pool
from orbitive._core._errors import OrbitError
from orbitive.pool import Key, Lease, ResourceId


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
