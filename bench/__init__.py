"""orbitive benchmarks, side by side with the locks users would pick instead.

Run from the repository root: ``.venv/bin/python -m bench [--quick] [--out DIR]``
(install the comparison packages with ``pip install -e '.[bench]'``). See
``docs/benchmarks.md`` for what is measured and the latest figures.
"""
