"""Build hook: the lock, pool and rate-limit tables' optional C steps (pure Python runs
without them).

Each module is one translation unit; its ``.h`` parts are listed as ``depends``,
so an edit to one rebuilds the module and an sdist carries them.

A module that fails to compile (no compiler, no Python headers) is skipped and
its Python twin runs, unless ``ORBITIVE_REQUIRE_C_STEPS=1`` is set: then the
build fails, as a release wheel without its C steps must (``scripts/dist``
sets it).
"""

import os

from setuptools import Extension, setup

OPTIONAL = os.environ.get("ORBITIVE_REQUIRE_C_STEPS") != "1"

SHARED = [f"src/orbitive/_core/{part}.h" for part in ("_robust", "_slots", "_layout")]
POOL_PARTS = ("_table", "_execution", "_availability")

setup(
    ext_modules=[
        Extension(
            "orbitive._core._robust_c",
            ["src/orbitive/_core/_robust.c"],
            depends=SHARED,
            optional=OPTIONAL,
        ),
        Extension(
            "orbitive.lock._fastpath",
            ["src/orbitive/lock/_fastpath.c"],
            include_dirs=["src/orbitive/_core"],
            depends=[*SHARED, "src/orbitive/lock/_steps.h", "src/orbitive/lock/_calls.h"],
            optional=OPTIONAL,
        ),
        Extension(
            "orbitive.pool._fastpath",
            ["src/orbitive/pool/_fastpath.c"],
            include_dirs=["src/orbitive/_core"],
            depends=[*SHARED, *(f"src/orbitive/pool/{part}.h" for part in POOL_PARTS)],
            optional=OPTIONAL,
        ),
        Extension(
            "orbitive.limits._fastpath",
            ["src/orbitive/limits/_fastpath.c"],
            include_dirs=["src/orbitive/_core"],
            depends=SHARED,
            optional=OPTIONAL,
        ),
    ]
)
