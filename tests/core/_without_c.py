"""Child of tests/core/test_native.py: orbitive in an interpreter whose C modules are missing.

Run by ``run_interpreter`` (a fresh interpreter); it imports orbitive only after
making the C modules named on its command line unimportable, as where no compiler
built them, and prints what it saw as one JSON object.
"""

from __future__ import annotations

import json
import sys
import warnings


def report(fleet_name: str, *modules: str) -> None:
    """Open two lock tables and a pool of ``fleet_name`` with ``modules`` missing; print JSON."""
    for module in modules:  # None: ``import`` raises ImportError
        sys.modules[module] = None  # type: ignore[assignment]  # a missing module's mark
    import orbitive  # noqa: PLC0415 - only after the C modules are made unimportable
    from orbitive.cli import version_text  # noqa: PLC0415
    from orbitive.lock import Acquired, LockKey, LockOwner, LockTable  # noqa: PLC0415
    from orbitive.pool import Pool  # noqa: PLC0415

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fleet = orbitive.Fleet.join(fleet_name, 2)
        tables = [LockTable(fleet), LockTable(fleet)]
        pool = Pool(fleet)
    got = tables[0].try_acquire(LockKey("tests.native", "key"), LockOwner(b"me"), 30.0)
    released = isinstance(got, Acquired) and tables[1].release(got.lease)
    pool.close()
    for table in tables:
        table.close()
    fleet.close()
    shown = [(w.category.__name__, str(w.message), w.filename) for w in caught]
    print(
        json.dumps(
            {
                "native": orbitive.native(),
                "warnings": shown,
                "released": released,
                "version": version_text(),
            }
        )
    )
