"""Build hook: the lock and pool tables' optional C steps (pure Python runs without them)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("orbitive.lock._fastpath", ["src/orbitive/lock/_fastpath.c"], optional=True),
        Extension("orbitive.pool._fastpath", ["src/orbitive/pool/_fastpath.c"], optional=True),
    ]
)
