"""Every ttl that is not a finite number of seconds > 0 raises InvalidTtl and changes nothing."""

from __future__ import annotations

import math
from typing import Any

import pytest

from orbitive.lock import Acquired, InvalidTtl, LockKey, LockOwner, LockTable

KEY = LockKey("tests.ttl", "job")
HELD = LockKey("tests.ttl", "held")
OWNER = LockOwner(b"owner")
BAD_TTLS = [0, 0.0, -1, -0.5, math.nan, math.inf, -math.inf, None, True, False, "5", 1e10]


@pytest.mark.parametrize("ttl", BAD_TTLS, ids=repr)
def test_bad_ttl_on_acquire_raises_invalid_ttl_and_creates_nothing(
    table: LockTable, ttl: Any
) -> None:
    before = table.statistics()
    with pytest.raises(InvalidTtl) as caught:
        table.try_acquire(KEY, OWNER, ttl)
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, TypeError)
    assert "ttl" in str(caught.value)
    assert table.current(KEY) is None
    assert table.leases() == []
    assert table.statistics() == before
    assert table.poll().events == ()


@pytest.mark.parametrize("ttl", BAD_TTLS, ids=repr)
def test_bad_ttl_on_renew_raises_invalid_ttl_and_leaves_the_lease_unchanged(
    table: LockTable, ttl: Any
) -> None:
    result = table.try_acquire(HELD, OWNER, 30.0)
    assert isinstance(result, Acquired)
    before = table.statistics()
    with pytest.raises(InvalidTtl):
        table.renew(result.lease, ttl)
    with pytest.raises(InvalidTtl):
        table.renew_owned(HELD, OWNER, ttl)
    assert table.current(HELD) == result.lease
    assert table.statistics() == before


def test_largest_accepted_ttl_works_and_int_ttl_is_accepted(table: LockTable) -> None:
    result = table.try_acquire(KEY, OWNER, 10**9)
    assert isinstance(result, Acquired)
    assert result.lease.remaining() > 10**8
    assert table.renew(result.lease, 1) is not None
