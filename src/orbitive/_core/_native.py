"""Which of orbitive's C modules this install built, and saying so where a table runs without.

The three C modules are optional: the install compiles them when a C compiler and
the Python headers are present, and otherwise succeeds without them (pip shows the
failed build only with ``-v``). They are the robust mutex of every section
(``_core._robust_c``; without it, the same mutex through ctypes), the lock table's
hot operations (``lock._fastpath``) and the pool table's (``pool._fastpath``);
without the last two, the same steps run in Python, holding the whole section.

Nothing else would tell: the results are the same, only far slower. So the first
table a process opens without its C steps emits one :class:`RuntimeWarning` naming
the cost and the remedy, and :func:`native` and ``orbit --version`` say what loaded.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from typing import Final

#: Every C module of the core, by import name.
MODULES: Final = ("orbitive._core._robust_c", "orbitive.lock._fastpath", "orbitive.pool._fastpath")
#: The C modules of an extra's subpackage, each with the distribution that subpackage
#: imports: they load only where that extra is installed, and :func:`native` leaves them
#: out (the rate-limit table's steps: ``orbitive.limits`` imports ``limits``).
EXTRA_MODULES: Final = {"orbitive.limits._fastpath": "limits"}
#: How to get them: a compiler and headers, and a reinstall that does not reuse the
#: wheel pip cached when it built this install without them.
REMEDY: Final = (
    "a C compiler and the Python headers build it (build-essential and python3-dev on "
    "Debian and Ubuntu, gcc and python3-devel on Fedora), then reinstall orbitive: "
    "pip install --force-reinstall --no-cache-dir orbitive"
)
_PACKAGE: Final = str(Path(__file__).resolve().parent.parent) + os.sep
#: The C modules this process has warned about.
_warned: set[str] = set()


def loaded() -> dict[str, bool]:
    """Each C module's import name and whether it loads in this process."""
    return {name: _loads(name) for name in MODULES}


def extra_loaded() -> dict[str, bool | None]:
    """Each extra's C module (:data:`EXTRA_MODULES`) and whether it loads in this process:
    None where its extra's distribution is not installed."""
    return {
        name: _loads(name) if importlib.util.find_spec(needs) is not None else None
        for name, needs in EXTRA_MODULES.items()
    }


def _loads(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def native() -> bool:
    """Whether every C module of orbitive is loaded (True only when all three are).

    Without them every operation gives the same results, run in Python and much
    slower (a lock table's acquire + release pair about 135 times the instructions); the first
    table opened without its C steps says so with a :class:`RuntimeWarning`.

    Returns:
        True when ``orbitive._core._robust_c``, ``orbitive.lock._fastpath`` and
        ``orbitive.pool._fastpath`` all import, else False. Raises nothing.
    """
    return all(loaded().values())


def warn_python_steps(module: str, cost: str) -> None:
    """Warn, once per process and module, that ``module`` is missing and what that costs.

    Args:
        module: the C module's import name (one of :data:`MODULES`).
        cost: what runs in Python instead and how much slower, as a sentence fragment.

    The warning is a :class:`RuntimeWarning` attributed to the first caller outside
    orbitive (the code that opened the table).
    """
    if module in _warned:
        return
    _warned.add(module)
    warnings.warn(
        f"orbitive: {module} is not built, so {cost}; {REMEDY}",
        RuntimeWarning,
        stacklevel=_caller_level(),
    )


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside the orbitive package (for warn)."""
    level, frame = 2, sys._getframe(2)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        level, frame = level + 1, frame.f_back
    return level
