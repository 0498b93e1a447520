"""The sdist of the installed ``limits``, whose own storage and strategy tests run on
orbitive's storages (``test_upstream``: ``shm://``; ``test_postgres_upstream``:
``postgresql://``).

It is the unpacked directory named by the environment variable ``ORBIT_LIMITS_SDIST``,
or else is fetched once (``pip download --no-binary :all: --no-deps limits==X``) into
``~/.cache/orbitive-tests``; without either (no network), the tests are skipped.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import limits
import pytest


def limits_sdist() -> Path:
    """The unpacked sdist of the installed ``limits`` (see the module); skips without one."""
    named = os.environ.get("ORBIT_LIMITS_SDIST")
    if named:
        return Path(named)
    version = limits.__version__
    cache = Path.home() / ".cache" / "orbitive-tests"
    root = cache / f"limits-{version}"
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one fetch and unpacking at a time
        if not (root / "tests" / "utils.py").exists():
            _fetch(cache, version)
    return root


def _fetch(cache: Path, version: str) -> None:
    """Download and unpack the sdist of ``limits`` ``version`` into ``cache``; skip without
    it."""
    fetched = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
         "-q", "-d", str(cache), f"limits=={version}"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    archive = cache / f"limits-{version}.tar.gz"
    if fetched.returncode != 0 or not archive.exists():
        pytest.skip(f"no limits {version} sdist (set ORBIT_LIMITS_SDIST): {fetched.stderr[-300:]}")
    with tarfile.open(archive) as opened:
        if hasattr(tarfile, "data_filter"):
            opened.extractall(cache, filter="data")
        else:  # pragma: no cover - Python without the extraction filters
            opened.extractall(cache)
