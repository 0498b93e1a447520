"""The list of command modules ``orbit`` registers, in ``--help`` order."""

from __future__ import annotations

from types import ModuleType

from . import _demo, _lock, _pool_command, _run, _store

MODULES: list[ModuleType] = [_lock, _store, _pool_command, _run, _demo]
