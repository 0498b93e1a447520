"""Each input that used to end in a traceback or an odd message: one line and a fitting exit."""

from __future__ import annotations

import platform
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orbitive import Fleet, __version__
from orbitive._core import _native
from orbitive.cli import _lock_commands, main
from orbitive.lock import LockTable
from orbitive.store import ErrorKind, InvalidStoreUrl, open_store

Capture = pytest.CaptureFixture[str]


def usage_error(argv: list[str], capsys: Capture) -> str:
    """The argparse error line of ``argv`` (exit 2, usage shown, no traceback)."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "usage: orbit" in err and "Traceback" not in err
    return err.splitlines()[-1]


@pytest.mark.parametrize("seconds", ["inf", "1e12", "1e9", "-1", "0", "nan", "-inf"])
def test_watch_seconds_out_of_range_is_a_usage_error(seconds: str, capsys: Capture) -> None:
    line = usage_error(["watch", "web", f"--seconds={seconds}"], capsys)
    assert line.startswith("orbit watch: error: argument --seconds: must be a number of seconds")
    assert repr(seconds) in line


def test_watch_with_a_long_but_allowed_time_stops_at_once_for_an_unknown_fleet(
    fleet_name: str, capsys: Capture
) -> None:
    assert main(["watch", fleet_name, "--seconds", "1e6"]) == 1
    assert "has no lock table" in capsys.readouterr().err


def not_a_database(tmp_path: Path) -> str:
    path = tmp_path / "passwd"
    path.write_text("root:x:0:0:root:/root:/bin/bash\n" * 200)
    return f"sqlite://{path}"


def test_open_store_on_a_file_that_is_not_sqlite_raises_a_named_store_error(
    tmp_path: Path,
) -> None:
    url = not_a_database(tmp_path)
    before = (tmp_path / "passwd").read_bytes()
    with pytest.raises(InvalidStoreUrl) as caught:
        open_store(url)
    assert caught.value.kind is ErrorKind.INVALID_INPUT
    assert "is not a SQLite database" in str(caught.value)
    assert (tmp_path / "passwd").read_bytes() == before  # left as it was
    assert [path.name for path in tmp_path.iterdir()] == ["passwd"]  # no -wal or -journal


@pytest.mark.parametrize("command", [["locks"], ["inspect", "job"], ["run", "--lock", "j"]])
def test_a_store_that_is_not_sqlite_is_one_line_and_exit_2(
    tmp_path: Path, command: list[str], capsys: Capture
) -> None:
    argv = [*command, "--store", not_a_database(tmp_path)]
    if command[0] == "run":
        argv += ["--", "true"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"orbit {command[0]}: ") and "not a SQLite database" in err
    assert len(err.splitlines()) == 1


def test_a_postgres_url_with_an_open_bracket_is_a_bad_url(capsys: Capture) -> None:
    with pytest.raises(InvalidStoreUrl, match="malformed"):
        open_store("postgresql://u:secret@[::1")
    assert main(["locks", "--store", "postgresql://u:secret@[::1"]) == 2
    err = capsys.readouterr().err
    assert "malformed" in err and "secret" not in err and "unavailable" not in err


@pytest.mark.parametrize("option", ["--workers", "--seconds"])
@pytest.mark.parametrize("value", ["nan", "many", "0"])
def test_demo_numbers_are_checked_with_a_plain_message(
    option: str, value: str, capsys: Capture
) -> None:
    line = usage_error(["demo", option, value], capsys)
    assert f"argument {option}: must be a " in line and repr(value) in line
    assert "_positive" not in line


def test_pool_on_a_lock_table_kind_says_what_the_kind_holds(
    fleet_name: str, capsys: Capture
) -> None:
    with Fleet.join(fleet_name, 2) as fleet:
        table = LockTable(fleet)
        assert main(["pool", fleet_name, "--kind", "228"]) == 1
        err = capsys.readouterr().err
        table.close()
    assert err.strip() == (
        f"orbit pool: the lock state table (kind 228) of fleet {fleet_name!r} is not a "
        f"resource pool table ('orbit list {fleet_name}' shows the fleet's objects)"
    )


@pytest.mark.parametrize(
    ("how", "missing"),
    [(["--all", "--yes"], "SHM objects"), (["--kind", "228"], "lock state table (kind 228)")],
)
def test_clear_of_an_unknown_fleet_exits_1_as_list_does(
    fleet_name: str, how: list[str], missing: str, capsys: Capture
) -> None:
    assert main(["list", fleet_name]) == 1
    assert main(["clear", fleet_name, *how]) == 1
    err = capsys.readouterr().err
    assert f"orbit clear: fleet {fleet_name!r} has no {missing} " in err


@pytest.mark.parametrize("module", ["orbitive", "orbitive.cli"])
def test_version_and_python_dash_m(module: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module, "--version"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0
    first, *modules = done.stdout.splitlines()
    assert first == f"orbit (orbitive) {__version__}, Python {platform.python_version()}"
    loaded = {**_native.loaded(), **_native.extra_loaded()}
    assert [line.split()[0] for line in modules] == list(loaded)
    for line, built in zip(modules, loaded.values(), strict=True):
        assert line.endswith("  loaded" if built else "  not built (Python steps run)")
    assert loaded["orbitive.limits._fastpath"] is not None  # the test extra has limits


def test_an_unreachable_postgres_is_one_line_and_exit_1(capsys: Capture) -> None:
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert main(["locks", "--store", f"postgresql://u@127.0.0.1:{port}/db"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("orbit locks: postgres store unavailable") and err.count("\n") == 1


def _a_bug(_fleet: str) -> None:
    raise ZeroDivisionError("division by zero")


def test_an_unexpected_exception_is_one_line_naming_how_to_see_where(
    fleet_name: str, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    monkeypatch.setattr(_lock_commands, "membership", _a_bug)  # a bug, planted
    monkeypatch.delenv("ORBIT_TRACEBACK", raising=False)
    with Fleet.join(fleet_name, 2):
        assert main(["list", fleet_name]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith("orbit list: unexpected ZeroDivisionError: division by zero (a bug")
        assert f"'ORBIT_TRACEBACK=1 orbit list {fleet_name}' shows where" in err
        monkeypatch.setenv("ORBIT_TRACEBACK", "1")
        with pytest.raises(ZeroDivisionError):
            main(["list", fleet_name])
