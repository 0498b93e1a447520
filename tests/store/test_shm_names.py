"""An ``shm://`` URL's fleet name is checked before it names anything in /dev/shm."""

from __future__ import annotations

import pytest

from orbitive.store import InvalidStoreUrl, open_store


@pytest.mark.parametrize("fleet", ["\x00", "a\x00b", "a/b", "..", "x" * 33])
def test_a_bad_fleet_name_is_a_bad_url_with_or_without_a_capacity(fleet: str) -> None:
    for query in ("", "?capacity=4"):
        with pytest.raises(InvalidStoreUrl):
            open_store(f"shm://{fleet}{query}")
