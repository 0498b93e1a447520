"""The list of command modules ``orbit`` registers, in ``--help`` order."""

from __future__ import annotations

from types import ModuleType

MODULES: list[ModuleType] = []
