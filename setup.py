"""Build hook: the optional C steps of the lock table (pure Python is used without them)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("orbitive.lock._fastpath", ["src/orbitive/lock/_fastpath.c"], optional=True)
    ]
)
