"""Each release artifact installs into a clean virtual environment and works there.

The wheel needs no compiler; the sdist builds its C steps where there is one and
installs as pure Python where there is none. The smoke check (``_smoke.py``) imports
orbitive, passes a lease between processes through a ``LockTable`` and reports
which C modules loaded; ``orbit --version`` runs from the environment's ``bin``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ._project import VERSION
from ._smoke import C_MODULES, SmokeReport
from ._venvs import CleanVenv, install_environment
from .conftest import DIST_TIMEOUT, Release

pytestmark = [pytest.mark.slow, pytest.mark.timeout(DIST_TIMEOUT)]


def assert_works(venv: CleanVenv, report: SmokeReport, *, c_steps: bool) -> None:
    """The smoke check ran the installed orbitive, with (or without) every C module."""
    assert Path(report["module_file"]).is_relative_to(venv.folder), report["module_file"]
    assert report["version"] == VERSION
    assert report["c_modules"] == dict.fromkeys(C_MODULES, c_steps)
    assert (report["while_held"], report["released"], report["after_release"]) == (
        "occupied",
        True,
        "acquired",
    )
    assert venv.orbit_version().startswith(f"orbit (orbitive) {VERSION}")


def test_the_wheel_installs_and_runs_its_c_steps_where_there_is_no_compiler(
    release: Release, tmp_path: Path, fleet_name: str
) -> None:
    venv = CleanVenv(tmp_path / "venv")
    venv.install(release.wheel, compiler=False)
    assert_works(venv, venv.smoke(fleet_name), c_steps=True)


def test_the_sdist_compiles_its_c_steps_where_there_is_a_compiler(
    release: Release, build_backend: Path, tmp_path: Path, fleet_name: str
) -> None:
    venv = CleanVenv(tmp_path / "venv")
    venv.install(release.sdist, compiler=True, find_links=build_backend)
    assert_works(venv, venv.smoke(fleet_name), c_steps=True)


def test_the_sdist_installs_as_pure_python_where_there_is_no_compiler(
    release: Release, build_backend: Path, tmp_path: Path, fleet_name: str
) -> None:
    venv = CleanVenv(tmp_path / "venv")
    done = venv.install(release.sdist, compiler=False, find_links=build_backend)
    assert "/bin/false" in done.stdout + done.stderr, "no compile step was tried"
    assert_works(venv, venv.smoke(fleet_name), c_steps=False)


def test_a_release_build_without_a_compiler_fails_instead_of_leaving_out_the_c_steps(
    release: Release, build_backend: Path, tmp_path: Path
) -> None:
    venv = CleanVenv(tmp_path / "venv")
    environment = {**install_environment(compiler=False), "ORBITIVE_REQUIRE_C_STEPS": "1"}
    done = venv.pip(
        "wheel",
        "--no-index",
        "--no-cache-dir",
        "--find-links",
        build_backend,
        "--wheel-dir",
        tmp_path / "wheels",
        release.sdist,
        environment=environment,
    )
    assert done.returncode != 0, done.stdout
    assert "/bin/false" in done.stdout + done.stderr
    assert not list(tmp_path.glob("wheels/*.whl"))
