"""Django's source distributions, fetched once and kept under ``.venv``.

An sdist ships Django's own test suite (``tests/runtests.py``) beside the
package, so one Python environment runs several Django versions: a process
with the unpacked sdist first on ``PYTHONPATH`` imports that Django (pure
Python; asgiref and sqlparse come from the environment).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Final

from ..._processes import ROOT

CACHE: Final = ROOT / ".venv" / "django-sources"
#: The other LTS line the engine supports, beside the environment's Django (5.2 on 3.11).
LTS_4_2: Final = "django>=4.2,<4.3"


def installed() -> str:
    """The pip requirement of the environment's own Django version."""
    return f"django=={importlib.metadata.version('django')}"


def source(requirement: str) -> Path:
    """The unpacked sdist of ``requirement``: a directory with ``django/`` and ``tests/``.

    Fetched with pip on first use (a few seconds), then kept under :data:`CACHE`.
    """
    directory = CACHE / re.sub(r"[^A-Za-z0-9.]+", "_", requirement)
    if (directory / "tests" / "runtests.py").exists():
        return directory
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as scratch:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        command += ["--no-binary", ":all:", "--disable-pip-version-check", "-d", scratch]
        subprocess.run([*command, requirement], check=True, timeout=300)
        (archive,) = Path(scratch).glob("*.tar.gz")
        unpacked = Path(scratch) / "unpacked"
        _unpack(archive, unpacked)
        with contextlib.suppress(OSError):  # another run got there first
            os.rename(unpacked, directory)
    return directory


def _unpack(archive: Path, into: Path) -> None:
    """Extract the sdist's ``django/`` and ``tests/`` directories into ``into``."""
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            _, _, inner = member.name.partition("/")
            wanted = inner.startswith(("django/", "tests/")) and ".." not in Path(inner).parts
            if wanted and (member.isfile() or member.isdir()):
                member.name = inner
                members.append(member)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(into, members=members, filter="data")
        else:  # Python without extraction filters: regular files and directories only
            tar.extractall(into, members=members)
