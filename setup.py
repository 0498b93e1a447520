"""Build hook: the lock and pool tables' optional C steps (pure Python runs without them)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("orbitive._robust_c", ["src/orbitive/_robust.c"], optional=True),
        Extension(
            "orbitive.lock._fastpath",
            ["src/orbitive/lock/_fastpath.c"],
            include_dirs=["src/orbitive"],
            optional=True,
        ),
        Extension(
            "orbitive.pool._fastpath",
            ["src/orbitive/pool/_fastpath.c"],
            include_dirs=["src/orbitive"],
            optional=True,
        ),
    ]
)
