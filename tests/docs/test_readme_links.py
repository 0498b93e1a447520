"""The README works wherever it is shown: on the index's project page as in the repository.

Every link is absolute or an anchor of one of its own headings; a link into the
repository (pyproject's ``Repository`` URL, then ``/blob/main/``, ``/raw/main/`` or
``/tree/main/``) names a path that exists. Relative links, which break outside the
repository, are refused.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from ..packaging._project import PYPROJECT, REPOSITORY, ROOT
from ._site import blocks

README: Final = (ROOT / "README.md").read_text()

FENCED_BLOCK: Final = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE_LINK: Final = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK: Final = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?", re.MULTILINE)
HTML_LINK: Final = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""")
HEADING: Final = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*$", re.MULTILINE)
ABSOLUTE: Final = re.compile(r"(?:https?|mailto):")
REPOSITORY_PATH: Final = re.compile(r"/(?:blob|raw|tree)/main/([^#?]+)(?:[#?].*)?")


def outside_code_blocks(markdown: str) -> str:
    """``markdown`` without its fenced code blocks, whose brackets and ``#`` lines are code."""
    return FENCED_BLOCK.sub("", markdown)


def link_targets(markdown: str) -> list[str]:
    """Every link and image target: inline, reference definitions and HTML attributes."""
    text = outside_code_blocks(markdown)
    return [
        *INLINE_LINK.findall(text),
        *REFERENCE_LINK.findall(text),
        *HTML_LINK.findall(text),
    ]


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings: lower case, punctuation dropped, spaces as
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


def link_problems(markdown: str, root: Path, repository: str) -> list[str]:
    """Each link of ``markdown`` that does not work outside the repository, with the reason."""
    anchors = heading_anchors(markdown)
    problems = []
    for target in link_targets(markdown):
        if target.startswith("#"):
            if target[1:] not in anchors:
                problems.append(f"{target}: no heading has this anchor")
        elif target.startswith(f"{repository}/"):
            path = REPOSITORY_PATH.fullmatch(target.removeprefix(repository))
            if path is None or not (root / path.group(1)).exists():
                problems.append(f"{target}: no such path in the repository")
        elif target != repository and not ABSOLUTE.match(target):
            problems.append(f"{target}: relative, so broken outside the repository")
    return problems


def test_every_readme_link_works_outside_the_repository() -> None:
    targets = link_targets(README)
    assert any(target.startswith(f"{REPOSITORY}/blob/main/docs/") for target in targets)
    assert any(target.startswith(f"{REPOSITORY}/raw/main/docs/") for target in targets)
    assert link_problems(README, ROOT, REPOSITORY) == []


def test_the_link_check_refuses_relative_links_unknown_anchors_and_missing_paths() -> None:
    markdown = "\n".join(
        [
            "# Title",
            "## Odd `code`, heading",
            "```sh",
            "# a shell comment, not a heading; [not](a-link)",
            "```",
            "[fine](#title) [fine](#odd-code-heading) [fine](https://example.org/x)",
            f"[fine]({REPOSITORY}/blob/main/docs/format.md)",
            f"![fine]({REPOSITORY}/raw/main/docs/benchmarks-contention.png)",
            "[relative](docs/format.md) ![relative](docs/benchmarks-contention.png)",
            "[unknown](#a-shell-comment-not-a-heading-not-a-link)",
            f"[missing]({REPOSITORY}/blob/main/docs/nothing.md)",
            f"[other branch]({REPOSITORY}/blob/dev/docs/format.md)",
            "[ref]: ../outside.md",
            '<img src="docs/benchmarks-contention.png">',
        ]
    )
    assert link_problems(markdown, ROOT, REPOSITORY) == [
        "docs/format.md: relative, so broken outside the repository",
        "docs/benchmarks-contention.png: relative, so broken outside the repository",
        "#a-shell-comment-not-a-heading-not-a-link: no heading has this anchor",
        f"{REPOSITORY}/blob/main/docs/nothing.md: no such path in the repository",
        f"{REPOSITORY}/blob/dev/docs/format.md: no such path in the repository",
        "../outside.md: relative, so broken outside the repository",
        "docs/benchmarks-contention.png: relative, so broken outside the repository",
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
