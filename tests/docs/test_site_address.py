"""The site has no address: it is not published, so nothing claims one.

``mkdocs.yml`` names no ``site_url`` or ``repo_url`` (the built site links relatively
and opens from ``site/``), ``pyproject.toml`` no project URLs, and no page, script or
configuration names the addresses at which nothing is published.
"""

from __future__ import annotations

from ..packaging._project import PYPROJECT, ROOT, tracked_files
from .test_readme_links import UNPUBLISHED


def test_mkdocs_and_pyproject_claim_no_address() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    for key in ("site_url", "repo_url", "repo_name", "edit_uri"):
        assert f"\n{key}:" not in config, key
    assert "urls" not in PYPROJECT["project"]


def test_no_tracked_file_names_an_unpublished_address() -> None:
    naming = [
        name
        for name in tracked_files(".")
        if name != "tests/docs/test_readme_links.py"  # it lists them, to refuse them
        and name.endswith((".md", ".py", ".toml", ".yml", ".cfg", ".in", ".txt", ".sh"))
        and any(address in (ROOT / name).read_text() for address in UNPUBLISHED)
    ]
    assert naming == []
