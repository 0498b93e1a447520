"""The release artifacts, built once per session by ``scripts/dist``, and what installing needs.

``scripts/dist`` sets up ``.venv-dist`` from PyPI on its first run (later runs reuse
it) and builds the sdist and, from it, the wheel for the interpreter running the
tests. Building needs a C compiler: without one the packaging tests are skipped,
except under CI, where they fail.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from ._project import PYPROJECT, ROOT, VERSION

DIST_TIMEOUT: Final = 600.0


@dataclass(frozen=True)
class Release:
    """What ``scripts/dist`` made: the sdist, this interpreter's wheel, and where its tools are."""

    sdist: Path
    wheel: Path
    tools: Path


def has_c_compiler() -> bool:
    """True when the compiler this interpreter builds extension modules with is on PATH."""
    compiler = os.environ.get("CC") or str(sysconfig.get_config_var("CC") or "")
    words = shlex.split(compiler)
    return bool(words) and shutil.which(words[0]) is not None


@pytest.fixture(scope="session")
def release(tmp_path_factory: pytest.TempPathFactory) -> Release:
    """``scripts/dist`` run once, into a folder of this session, for this interpreter."""
    if not has_c_compiler() and not os.environ.get("CI"):
        pytest.skip("no C compiler: scripts/dist builds only wheels with their C steps")
    out = tmp_path_factory.mktemp("dist")
    environment = {**os.environ, "DIST_DIR": str(out)}
    environment.pop("ORBITIVE_REQUIRE_C_STEPS", None)
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "dist"), sys.executable],
        env=environment,
        capture_output=True,
        text=True,
        timeout=DIST_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"scripts/dist failed:\n{done.stdout}\n{done.stderr}"
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    wheels = sorted(out.glob(f"orbitive-{VERSION}-{tag}-{tag}-*.whl"))
    assert len(wheels) == 1, sorted(path.name for path in out.iterdir())
    return Release(
        sdist=out / f"orbitive-{VERSION}.tar.gz",
        wheel=wheels[0],
        tools=ROOT / ".venv-dist" / "bin",
    )


@pytest.fixture(scope="session")
def build_backend(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of wheels of the sdist's build requirements (setuptools), fetched once.

    With it an sdist installs with ``--no-index``, in pip's usual isolated build. The
    download is the one step of these tests that needs PyPI once .venv-dist exists.
    """
    folder = tmp_path_factory.mktemp("build-backend")
    requirements: list[str] = PYPROJECT["build-system"]["requires"]
    done = subprocess.run(
        [
            str(release.tools / "python"),
            "-m",
            "pip",
            "download",
            "--quiet",
            "--only-binary=:all:",
            "--dest",
            str(folder),
            *requirements,
        ],
        capture_output=True,
        text=True,
        timeout=DIST_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"pip download {requirements} failed:\n{done.stderr}"
    assert any(folder.glob("setuptools-*.whl")), sorted(path.name for path in folder.iterdir())
    return folder
