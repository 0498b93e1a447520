"""Run any script as an install without a C compiler runs it: orbitive's C modules refuse.

Put this directory first on ``PYTHONPATH`` (``PYTHONPATH=bench/without_c``): the
interpreter imports this module at start-up, and every compiled module of the
``orbitive`` package then raises ImportError, as where it was never built. Child
processes inherit the variable, so ``bench/instructions.py`` counts its workloads
that way too.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType


class _NoCompiledModules(importlib.abc.MetaPathFinder):
    """Refuses the extension modules of the orbitive package."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("orbitive."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            raise ImportError(f"{fullname} is refused (bench/without_c: no C modules)")
        return None


sys.meta_path.insert(0, _NoCompiledModules())
