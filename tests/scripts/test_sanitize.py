"""The sanitizer step (scripts/sanitize) fails when the C code reads past a mapping.

A throw-away copy of the sources gets one planted bug: the C twin's
``RobustMutex.release_mine`` reads the byte right after its section block's
mapping. The step builds that copy with AddressSanitizer and runs a test that
calls it; it must fail with ASan's report naming the function. The bug lives only
in the copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "sanitize"
#: Where the bug goes: the start of release_mine, after its state check.
TARGET = "src/orbitive/_core/_robust.c"
ANCHOR = """static PyObject *RobustMutex_release_mine(RobustMutex *self, PyObject *unused)
{
    if (!ready(self))
        return NULL;
"""
PLANTED = "    (void)*(volatile uint8_t *)(self->block + self->view.len); /* past the mapping */\n"


def _has_asan() -> bool:
    gcc = shutil.which("gcc")
    if gcc is None:
        return False
    runtime = subprocess.run(
        [gcc, "-print-file-name=libasan.so"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return os.path.isabs(runtime) and os.path.exists(runtime)


NEEDS_ASAN = pytest.mark.skipif(not _has_asan(), reason="needs gcc with AddressSanitizer")


@NEEDS_ASAN
@pytest.mark.slow
def test_the_sanitizer_step_fails_on_a_read_past_a_mapping(tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    ignore = shutil.ignore_patterns("*.so", "__pycache__", "*.egg-info")
    for part in ("src", "tests"):
        shutil.copytree(ROOT / part, copy / part, ignore=ignore)
    for part in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / part, copy / part)
    target = copy / TARGET
    source = target.read_text()
    assert source.count(ANCHOR) == 1, f"{TARGET} changed shape: move the planted bug"
    target.write_text(source.replace(ANCHOR, ANCHOR + PLANTED))
    done = subprocess.run(
        [
            "bash",
            str(SCRIPT),
            "--source",
            str(copy),
            "tests/core/test_section.py",
            "-k",
            "release_mine_unlocks_only_the_stripes_this_thread_holds and c",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHON": sys.executable},
        check=False,
    )
    assert done.returncode != 0, done.stderr[-3000:]
    assert "ERROR: AddressSanitizer" in done.stderr, done.stderr[-3000:]
    assert "RobustMutex_release_mine" in done.stderr, done.stderr[-3000:]
    assert PLANTED not in (ROOT / TARGET).read_text()
