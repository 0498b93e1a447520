"""Backend choice: once at import, forced by ORBIT_READINESS, an honest error otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import orbitive
from orbitive._core._errors import ReadinessUnavailable
from orbitive._core._readiness import BACKEND, BACKENDS, ENV_VAR, select_backend

_IMPORT = "from orbitive._core import _readiness as r; print(r.BACKEND.NAME)"


def _runs(name: str) -> bool:
    try:
        BACKENDS[name].probe()
    except OSError:
        return False
    return True


def _import_with(value: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, ENV_VAR: value}
    return subprocess.run(
        [sys.executable, "-c", _IMPORT],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_default_prefers_futex_when_it_runs() -> None:
    expected = "futex" if _runs("futex") else "pipe"
    assert select_backend(None) is BACKENDS[expected]
    if ENV_VAR not in os.environ:
        assert BACKEND is BACKENDS[expected]


@pytest.mark.parametrize("name", ["futex", "pipe"])
def test_environment_variable_forces_the_backend_at_import(name: str) -> None:
    if not _runs(name):
        pytest.skip(f"{name} cannot run here")
    result = _import_with(name)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == name


def test_unknown_backend_in_the_environment_fails_the_import_clearly() -> None:
    result = _import_with("kqueue")
    assert result.returncode != 0
    assert "ReadinessUnavailable" in result.stderr
    assert "ORBIT_READINESS='kqueue'" in result.stderr
    assert "futex, pipe" in result.stderr


def test_when_no_backend_runs_the_error_lists_each_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, backend in BACKENDS.items():

        def refuse(name: str = name) -> None:
            raise OSError(f"{name} refused for the test")

        monkeypatch.setattr(backend, "probe", refuse)
    with pytest.raises(ReadinessUnavailable) as caught:
        select_backend(None)
    assert isinstance(caught.value, OSError)
    message = str(caught.value)
    assert "futex: futex refused for the test" in message
    assert "pipe: pipe refused for the test" in message


def test_a_forced_backend_that_cannot_run_is_not_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse() -> None:
        raise OSError("no futex today")

    monkeypatch.setattr(BACKENDS["futex"], "probe", refuse)
    with pytest.raises(ReadinessUnavailable, match="futex: no futex today") as caught:
        select_backend("futex")
    assert "pipe" not in str(caught.value)


def test_only_readiness_modules_check_the_platform() -> None:
    package = Path(orbitive.__file__).parent
    offenders = [
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "sys.platform" in path.read_text() and not path.name.startswith("_readiness")
    ]
    assert offenders == []
