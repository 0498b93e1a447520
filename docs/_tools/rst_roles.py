"""A Griffe extension: the docstrings' reStructuredText roles, read as Markdown.

The docstrings are written for ``help()`` and an editor, with Sphinx roles
(``:class:`~orbitive.lock.LockTable```) and ``::`` before a literal block. The API
reference renders them as Markdown, where a role would show as its raw text. This
extension rewrites each role as inline code of the name it shows (the last dotted
part after ``~``, as Sphinx would) and a ``::`` paragraph end as ``:``; the text of
the docstrings is left as it is.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|data|attr|mod|exc|obj|const):`(~?)([^`]+)`")
_LITERAL = re.compile(r"(\S)::\n")


def _shown(match: re.Match[str]) -> str:
    short, target = match.groups()
    name = target.lstrip(".")
    if short:
        name = name.rsplit(".", 1)[-1]
    return f"`{name}`"


def markdown_of(text: str) -> str:
    """``text`` with its roles as inline code and ``word::`` as ``word:``."""
    return _LITERAL.sub(r"\1:\n", _ROLE.sub(_shown, text))


class RstRoles(griffe.Extension):
    """Rewrite the roles of every docstring once it is loaded."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_of(obj.docstring.value)
