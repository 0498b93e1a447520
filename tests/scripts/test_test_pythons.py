"""scripts/test-pythons names the interpreters it found, and finding none is no failure.

Each run gets a home of its own (no ``~/.pyenv``) and a PATH holding only the
tools the script calls besides bash's builtins, so that what it finds is what
the test put there: nothing, or this interpreter in pyenv's layout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "test-pythons"
#: The commands the script runs that are not bash builtins.
TOOLS = ("dirname", "cut")


def run(home: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    tools = home / "bin"
    tools.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found is not None, f"{tool} is not on PATH"
        (tools / tool).symlink_to(found)
    bash = shutil.which("bash")
    assert bash is not None
    return subprocess.run(
        [bash, str(SCRIPT), *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        env={"HOME": str(home), "PATH": str(tools)},
        check=False,
    )


def test_no_other_interpreter_found_is_said_and_passes(tmp_path: Path) -> None:
    done = run(tmp_path)
    assert done.returncode == 0, done.stderr
    assert "no CPython 3.10-3.13 besides the default" in done.stderr
    assert "found in ~/.pyenv/versions or on PATH: nothing more to test" in done.stderr
    assert "found CPython" not in done.stderr


def test_each_interpreter_found_is_named_with_its_path(tmp_path: Path) -> None:
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    interpreter = tmp_path / ".pyenv" / "versions" / version / "bin" / f"python{version}"
    interpreter.parent.mkdir(parents=True)
    interpreter.symlink_to(os.path.realpath(sys.executable))
    done = run(tmp_path, "--list")
    assert done.returncode == 0, done.stderr
    assert f"scripts/test-pythons: found CPython {version}: {interpreter}" in done.stderr
    assert "fast suites" not in done.stderr  # --list runs nothing
