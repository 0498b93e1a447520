"""docs/format.md, read once, and its sections by heading (for the layout-doc tests)."""

from __future__ import annotations

from pathlib import Path

DOC = (Path(__file__).resolve().parents[2] / "docs" / "format.md").read_text()


def section(title: str) -> str:
    """The text from the heading that starts with ``title`` to the next ``## `` heading."""
    start = DOC.index(title)
    end = DOC.find("\n## ", start + 1)
    return DOC[start : end if end >= 0 else len(DOC)]
