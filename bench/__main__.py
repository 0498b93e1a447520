"""``python -m bench``: run the benchmarks (see :mod:`bench`)."""

from __future__ import annotations

from ._runner import main

main()
