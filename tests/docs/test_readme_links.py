"""Every link of the README and of the docs' pages leads somewhere from a clone.

Neither the repository nor the site is published at an address, so the pages link
relatively: a link names a file of the repository (relative to the page, as a forge
renders it and as ``./scripts/docs`` builds it) and, after ``#``, a heading of that
file; an anchor alone names a heading of the page itself. Absolute links go to other
sites only (checked without the network: they must not be the unpublished addresses).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from ..packaging._project import PYPROJECT, ROOT
from ._site import blocks

README: Final = (ROOT / "README.md").read_text()
#: Every page whose links are checked: the README, the changelog and the docs' pages.
PAGES: Final = (ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md")))
#: Addresses at which nothing of this project is published.
UNPUBLISHED: Final = ("https://orbitive.github.io/orbitive", "https://github.com/orbitive/orbitive")

FENCED_BLOCK: Final = re.compile(r"^ *```.*?^ *```", re.MULTILINE | re.DOTALL)
INLINE_CODE: Final = re.compile(r"`[^`\n]*`")
INLINE_LINK: Final = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK: Final = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?", re.MULTILINE)
HTML_LINK: Final = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""")
AUTOLINK: Final = re.compile(r"<([a-z]+:[^>\s]+)>")
HEADING: Final = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*$", re.MULTILINE)
ABSOLUTE: Final = re.compile(r"[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def outside_code_blocks(markdown: str) -> str:
    """``markdown`` without its fenced code blocks, whose brackets and ``#`` lines are code."""
    return FENCED_BLOCK.sub("", markdown)


def link_targets(markdown: str) -> list[str]:
    """Every link and image target: inline, reference definitions, HTML attributes and
    autolinks (inline code left out)."""
    text = INLINE_CODE.sub("", outside_code_blocks(markdown))
    return [
        *INLINE_LINK.findall(text),
        *REFERENCE_LINK.findall(text),
        *HTML_LINK.findall(text),
        *AUTOLINK.findall(text),
    ]


def heading_anchors(markdown: str) -> set[str]:
    """The anchors a forge gives the headings: lower case, punctuation dropped, spaces as
    hyphens, and ``-1``, ``-2`` ... after a repeated one."""
    anchors: set[str] = set()
    for heading in HEADING.findall(outside_code_blocks(markdown)):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchor, repeat = slug, 0
        while anchor in anchors:
            repeat += 1
            anchor = f"{slug}-{repeat}"
        anchors.add(anchor)
    return anchors


def link_problems(page: Path, root: Path) -> list[str]:
    """Each link of ``page`` that leads nowhere from a clone rooted at ``root``, with why."""
    problems = []
    for target in link_targets(page.read_text()):
        if ABSOLUTE.match(target):
            if target.startswith(UNPUBLISHED):
                problems.append(f"{target}: nothing is published there")
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.is_relative_to(root.resolve()) or not linked.exists():
            problems.append(f"{target}: no such file in the repository")
        elif anchor and (
            linked.suffix != ".md" or anchor not in heading_anchors(linked.read_text())
        ):
            problems.append(f"{target}: no heading of {linked.name} has this anchor")
    return problems


def test_every_link_of_the_readme_and_the_docs_leads_somewhere() -> None:
    problems = {
        str(page.relative_to(ROOT)): found for page in PAGES if (found := link_problems(page, ROOT))
    }
    assert problems == {}
    targets = link_targets(README)
    assert "docs/index.md" in targets
    assert "docs/benchmarks-contention.png" in targets


def test_the_link_check_finds_missing_files_anchors_and_unpublished_addresses(
    tmp_path: Path,
) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## Odd `code`, heading\n")
    (tmp_path / "outside.md").write_text("# Outside\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "\n".join(
            [
                "# Title",
                "```sh",
                "# a shell comment, not a heading; [not](a-link)",
                "```",
                "[fine](#title) [fine](docs/page.md#odd-code-heading) [fine](https://example.org/x)",
                "`[code, not a link](nowhere.md)` <https://example.org/y>",
                "[missing](docs/nothing.md) [unknown](docs/page.md#a-shell-comment)",
                "[unknown here](#a-shell-comment-not-a-heading-not-a-link)",
                f"[unpublished]({UNPUBLISHED[0]}/page/) <{UNPUBLISHED[1]}>",
                "[ref]: ../outside.md",
                '<img src="docs/nothing.png">',
            ]
        )
    )
    assert link_problems(readme, tmp_path) == [
        "docs/nothing.md: no such file in the repository",
        "docs/page.md#a-shell-comment: no heading of page.md has this anchor",
        "#a-shell-comment-not-a-heading-not-a-link: no heading of README.md has this anchor",
        f"{UNPUBLISHED[0]}/page/: nothing is published there",
        "../outside.md: no such file in the repository",
        "docs/nothing.png: no such file in the repository",
        f"{UNPUBLISHED[1]}: nothing is published there",
    ]


#: The optional-dependency groups that are the project's tools, not a user's extras.
TOOL_GROUPS: Final = frozenset({"bench", "docs", "test"})
#: The extra each module an example may import comes with.
EXTRA_OF_MODULE: Final = {
    "psycopg": "postgres",
    "orbitive.clients.psycopg": "postgres",
    "redis": "redis",
    "sqlalchemy": "sqlalchemy",
    "orbitive.clients.sqlalchemy": "sqlalchemy",
    "asyncpg": "asyncpg",
    "orbitive.clients.asyncpg": "asyncpg",
    "django": "django",
    "orbitive.clients.django": "django",
    "prometheus_client": "metrics",
    "orbitive.metrics": "metrics",
    "celery": "celery",
    "orbitive.celery": "celery",
}
IMPORT: Final = re.compile(r"^\s*(?:from|import)\s+([\w.]+)", re.MULTILINE)


def installation_section() -> str:
    return README.split("\n## Installation\n", 1)[1].split("\n## ", 1)[0]


def test_the_installation_section_lists_every_extra() -> None:
    section = installation_section()
    extras = re.findall(r"pip install 'orbitive\[(\w+)\]'", section)
    assert "pip install orbitive " in section
    assert sorted(extras) == sorted(
        set(PYPROJECT["project"]["optional-dependencies"]) - TOOL_GROUPS
    )


def test_the_clone_install_installs_what_the_examples_import() -> None:
    clone = re.search(r"`pip install '\.\[([\w,]+)\]'`", installation_section())
    assert clone is not None
    imported = {
        module
        for block in blocks(ROOT / "README.md")
        if block.language == "python"
        for module in IMPORT.findall(block.code)
    }
    needed = {EXTRA_OF_MODULE[module] for module in imported if module in EXTRA_OF_MODULE}
    assert needed == {"postgres", "metrics"}  # the pool's and the metrics' examples
    assert needed <= set(clone.group(1).split(","))
