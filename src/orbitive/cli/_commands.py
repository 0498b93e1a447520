"""The list of command modules ``orbit`` registers, in ``--help`` order."""

from __future__ import annotations

from types import ModuleType

from . import (
    _budget_command,
    _demo,
    _lock_commands,
    _pool_command,
    _run,
    _store_commands,
    _tasks_command,
)

MODULES: list[ModuleType] = [
    _lock_commands,
    _store_commands,
    _tasks_command,
    _pool_command,
    _budget_command,
    _run,
    _demo,
]
