"""Clean virtual environments to install a release artifact into, with or without a C compiler.

A clean environment holds nothing but the interpreter: no pip (pip runs from the
test's own interpreter with ``--python``), no setuptools, no orbitive. Installs are
offline (``--no-index``): the core has no dependencies, and an sdist's build
backend comes from a local folder of wheels.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final, cast

from . import _smoke
from ._smoke import SmokeReport

SMOKE_SCRIPT: Final = Path(_smoke.__file__)
INSTALL_TIMEOUT: Final = 300.0
RUN_TIMEOUT: Final = 60.0


def install_environment(*, compiler: bool) -> dict[str, str]:
    """This process's environment for pip, less pip's settings and the release build's switch.

    pip reads no configuration file and no ``PIP_*`` variable, and
    ``ORBITIVE_REQUIRE_C_STEPS`` is unset. With ``compiler=False``, ``CC`` is
    ``/bin/false`` and ``PATH`` holds no C compiler, so any compile step fails as it
    would on a machine without one.
    """
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("PIP_") and name != "ORBITIVE_REQUIRE_C_STEPS"
    }
    environment["PIP_CONFIG_FILE"] = os.devnull
    if not compiler:
        environment["CC"] = "/bin/false"
        environment["PATH"] = str(Path(sys.executable).parent)
        for name in ("gcc", "cc", "clang"):
            assert shutil.which(name, path=environment["PATH"]) is None, name
    return environment


class CleanVenv:
    """A new virtual environment in ``folder``, made from the interpreter running the tests."""

    def __init__(self, folder: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
        self.folder = folder
        self.bin = folder / "bin"
        self.python = self.bin / "python"

    def pip(
        self, *arguments: str | Path, environment: dict[str, str]
    ) -> subprocess.CompletedProcess[str]:
        """Run pip (the test interpreter's) on this environment with ``--python``."""
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(self.python),
                "--disable-pip-version-check",
                *map(str, arguments),
            ],
            env=environment,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT,
            check=False,
        )

    def install(
        self, artifact: Path, *, compiler: bool, find_links: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Install ``artifact`` offline (wheels only from ``find_links``); asserts it succeeds.

        ``--no-cache-dir`` keeps pip from reusing a wheel built by an earlier install;
        ``--verbose`` keeps the build's output, which pip hides otherwise.
        """
        links = ["--find-links", str(find_links)] if find_links is not None else []
        done = self.pip(
            "install",
            "--verbose",
            "--no-index",
            "--no-cache-dir",
            *links,
            artifact,
            environment=install_environment(compiler=compiler),
        )
        assert done.returncode == 0, (
            f"pip install {artifact.name} failed:\n{done.stdout}\n{done.stderr}"
        )
        return done

    def run_environment(self) -> dict[str, str]:
        """What a user's shell in this environment would have: its bin folder first on PATH."""
        return {**os.environ, "PATH": f"{self.bin}:{os.environ.get('PATH', '')}"}

    def smoke(self, fleet_name: str) -> SmokeReport:
        """Run the smoke script with this environment's interpreter from its own folder."""
        done = subprocess.run(
            [str(self.python), "-I", str(SMOKE_SCRIPT), fleet_name],
            cwd=self.folder,
            env=self.run_environment(),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            check=False,
        )
        assert done.returncode == 0, f"the smoke check failed:\n{done.stdout}\n{done.stderr}"
        return cast(SmokeReport, json.loads(done.stdout))

    def orbit_version(self) -> str:
        """What this environment's ``orbit --version`` prints."""
        done = subprocess.run(
            [str(self.bin / "orbit"), "--version"],
            cwd=self.folder,
            env=self.run_environment(),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            check=True,
        )
        return done.stdout
