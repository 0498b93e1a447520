"""The suite's build of the site (the ``mkdocs build`` line of ``scripts/test``) fails
on any warning.

``mkdocs build --strict`` counts the warnings it logs; with ``--quiet`` it logs none,
so a strict build with ``--quiet`` never fails. The line is run as written, in a tiny
site of one page, once with a link to a page that does not exist (it must fail and
name the link) and once without (it must pass, so the failure is the warning's).
The doc tools are bounded above, so a new release cannot start such a failure in a
fresh clone unnoticed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Final

from ..packaging._project import PYPROJECT, ROOT

SCRIPT: Final = ROOT / "scripts" / "test"
#: The distributions that read the docstrings and render the site.
DOC_TOOLS: Final = ("mkdocs", "mkdocs-material", "mkdocstrings", "mkdocstrings-python", "griffelib")
BOUNDS: Final = re.compile(r"(?P<name>[\w-]+)>=(?P<low>[\d.]+),<(?P<high>[\d.]+)")


def build_line() -> str:
    """The one line of ``scripts/test`` that builds the site."""
    lines = [line for line in SCRIPT.read_text().splitlines() if "mkdocs build" in line]
    assert len(lines) == 1, lines
    return lines[0]


def build_tiny_site(directory: Path, page: str) -> subprocess.CompletedProcess[str]:
    """Run :func:`build_line` in ``directory``, a site whose one page is ``page``; its
    ``.venv`` is this interpreter's environment."""
    (directory / "docs").mkdir()
    (directory / "docs" / "index.md").write_text(page)
    (directory / "mkdocs.yml").write_text("site_name: tiny\n")
    (directory / ".venv").symlink_to(sys.prefix)
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", f'site="$1"\n{build_line()}', "build", "out"],
        check=False,
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_suites_site_build_fails_on_a_warning(tmp_path: Path) -> None:
    built = build_tiny_site(tmp_path, "# Tiny\n\nSee [the missing page](missing.md).\n")
    assert built.returncode != 0, built.stderr
    assert "WARNING" in built.stderr
    assert "missing.md" in built.stderr
    assert "Aborted with 1 warnings in strict mode" in built.stdout


def test_the_suites_site_build_passes_a_clean_site(tmp_path: Path) -> None:
    built = build_tiny_site(tmp_path, "# Tiny\n\nNothing to link to.\n")
    assert built.returncode == 0, built.stderr
    assert "WARNING" not in built.stderr
    assert (tmp_path / "out" / "index.html").exists()


def release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_the_doc_tools_are_bounded_and_installed_within_the_bounds() -> None:
    bounds = {}
    for requirement in PYPROJECT["project"]["optional-dependencies"]["docs"]:
        found = BOUNDS.fullmatch(requirement)
        if found is not None:
            bounds[found["name"]] = (release(found["low"]), release(found["high"]))
    assert set(DOC_TOOLS) <= set(bounds), bounds
    for tool in DOC_TOOLS:
        low, high = bounds[tool]
        assert low <= release(metadata.version(tool)) < high, tool
