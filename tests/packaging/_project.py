"""The repository's own files, as the packaging tests read them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Final

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT: Final = Path(__file__).resolve().parents[2]
PYPROJECT: Final[dict[str, Any]] = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION: Final[str] = PYPROJECT["project"]["version"]


def tracked_files(folder: str) -> list[str]:
    """The paths git tracks under ``folder`` (relative to the repository root)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", folder], cwd=ROOT, capture_output=True, check=True
    ).stdout
    return [name for name in listed.decode().split("\0") if name]
