"""Fixtures of the section tests: the mechanism new objects record, the twin that locks."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from orbitive._core import _section

#: The two robust mutex twins: the C module and ctypes.
TWINS = ["c", "ctypes"]


@pytest.fixture(params=["mutex", "flock"])
def mechanism(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Objects created in this test record this mechanism (children inherit it)."""
    monkeypatch.setenv("ORBIT_SECTION", request.param)
    yield request.param


@pytest.fixture(params=TWINS)
def locking_twin(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """This process locks sections with the C module or with ctypes for this test."""
    if request.param == "ctypes":
        monkeypatch.setitem(vars(_section), "_robust_c", None)
    return str(request.param)
