"""The pool scenario of ``orbit demo`` runs real workers and keeps max_live."""

from __future__ import annotations

import re

import pytest

from orbitive.cli._demo_pool import run_pool_demo


def test_pool_demo_shares_connections_within_max_live(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_pool_demo(workers=4, seconds=1.5) == 0
    out = capsys.readouterr().out
    counts = {k: int(v.replace(",", "")) for k, v in re.findall(r"plans (\w+)\s+([\d,]+)", out)}
    assert counts["Create"] >= 1
    assert counts["LocalReuse"] + counts["RemoteReuse"] > 0
    highest = int(re.search(r"highest live seen\s+([\d,]+)", out).group(1))  # type: ignore[union-attr]
    assert 1 <= highest <= 2  # max_live = workers // 2
    assert "verdict: OK" in out
