"""The site's address is stated once (pyproject's Documentation URL), and the README's
links into the site name pages that exist."""

from __future__ import annotations

import re

from ..packaging._project import PYPROJECT, ROOT
from .test_readme_links import README, link_targets

SITE = PYPROJECT["project"]["urls"]["Documentation"]


def test_mkdocs_publishes_the_site_where_pyproject_says() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    assert re.search(rf"^site_url: {re.escape(SITE)}$", config, re.MULTILINE)


def test_every_readme_link_into_the_site_names_a_page() -> None:
    pages = [
        target.removeprefix(SITE) for target in link_targets(README) if target.startswith(SITE)
    ]
    assert "" in pages  # the site's home
    for page in pages:
        path = page.split("#", 1)[0].rstrip("/") or "index"
        assert (ROOT / "docs" / f"{path}.md").exists(), page
