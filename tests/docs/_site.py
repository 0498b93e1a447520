"""The code blocks of the documentation site (``docs/``) and the README, read as programs.

Every fenced block has a language. A page's blocks run in order as one program
(:mod:`tests.docs._site_run`): ``python`` blocks in one namespace, ``sh`` blocks in
``bash``, ``sql`` blocks on the PostgreSQL server that the host name ``db`` leads to.
A ``text`` block is output or a synopsis, shown and not run. An HTML comment on the
line before a block changes what is done with it:

* ``<!-- file: NAME -->``: the block is a file of the page's example, written into
  the page's folder before its program runs (a server's configuration, say);
* ``<!-- server: URL -->``: an ``sh`` block that starts a server; it is started as
  written (port 8000 moved to a free one), ``URL`` is fetched until it answers 200 a
  few times, and the server is stopped;
* ``<!-- not-run: REASON -->``: a block that cannot run alone; the reason says why
  and where it is tested instead, and :data:`NOT_RUN_MOST` bounds how many there are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
DOCS: Final = ROOT / "docs"
#: Every page whose blocks are tested: the site's pages and the README.
PAGES: Final = (ROOT / "README.md", *sorted(DOCS.rglob("*.md")))
LANGUAGES: Final = frozenset({"python", "sh", "sql", "text"})
#: At most this many blocks, over every page, may be marked ``not-run``.
NOT_RUN_MOST: Final = 12  # the soak (operations.md) and the slices of the suite (quickstart.md)
#: The port the docs' server examples listen on, moved to a free one when run.
DOCS_PORT: Final = 8000

_FENCE: Final = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<lang>[^\s`]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
_MARKER: Final = re.compile(r"<!--\s*(file|server|not-run):\s*(.*?)\s*-->")


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its language, its marker and its text."""

    page: str
    line: int
    language: str
    code: str
    marker: str = ""
    argument: str = ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def page_name(path: Path) -> str:
    """``README.md``, or a page's path under ``docs/`` (``reference/lock.md``)."""
    return path.name if path.parent == ROOT else str(path.relative_to(DOCS))


def page_path(name: str) -> Path:
    return ROOT / name if name == "README.md" else DOCS / name


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path``, in order, each with the marker on the line before."""
    text = path.read_text()
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _MARKER.fullmatch(before.strip())
        indent = len(match["indent"])
        code = "".join(line[indent:] + "\n" for line in match["body"].splitlines())
        found.append(
            Block(
                page=page_name(path),
                line=text.count("\n", 0, match.start()) + 1,
                language=match["lang"],
                code=code,
                marker=marker.group(1) if marker else "",
                argument=marker.group(2) if marker else "",
            )
        )
    return found


def every_block() -> list[Block]:
    return [block for path in PAGES for block in blocks(path)]


def runnable_pages() -> list[str]:
    """The pages with at least one block that runs (or is a file a server reads)."""
    return [
        page_name(path)
        for path in PAGES
        if any(block.language != "text" and block.marker != "not-run" for block in blocks(path))
    ]


def on_free_port(code: str, port: int) -> str:
    """``code`` with the docs' port (8000) replaced by ``port``."""
    return re.sub(rf"(?<=[:= ]){DOCS_PORT}\b", str(port), code)
