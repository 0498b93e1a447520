"""Every error path of ``orbit``, run through the installed console script: each line
on stderr starts ``orbit COMMAND:``, the exit status is the documented one, and an
object is named by what it is, its kind number only in parentheses.

The fleets are missing, or hold objects that are corrupt (random bytes, mode 0600),
not exclusively ours (mode 0644) or another user's (owned by nobody: as root only).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .._fleets import shm_path

#: The ``orbit`` console script of the interpreter running the tests.
ORBIT = Path(sys.executable).with_name("orbit")
#: A kind number said without what it is ("kind 247" alone, not "(kind 247)").
RAW_KIND = re.compile(r"(?<!\()kind \d+")
#: The kinds a fleet's lock tables, pool table and budget board use.
KINDS = (228, 229, 230, 231, 247, 248)


def orbit(*argvs: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """Run ``orbit`` once per argument list, all at once; their results in order."""
    started = [
        subprocess.Popen(
            [str(ORBIT), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for argv in argvs
    ]
    done = []
    for argv, process in zip(argvs, started, strict=True):
        out, err = process.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(argv, process.returncode, out, err))
    return done


def closed_port() -> int:
    """A loopback port nobody listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def plant(fleet: str, *, mode: int, owner: int | None = None) -> None:
    """Random bytes at each of the fleet's kinds (as a torn or foreign write leaves)."""
    for kind in KINDS:
        path = shm_path(fleet, kind)
        path.write_bytes(os.urandom(4096))
        path.chmod(mode)
        if owner is not None:
            os.chown(path, owner, owner)


@pytest.fixture(params=["missing", "corrupt", "not ours", "another user's"])
def fleet_state(request: pytest.FixtureRequest, fleet_name: str) -> Iterator[str]:
    """``fleet_name`` missing, or its objects corrupt or not the user's."""
    if request.param == "corrupt":
        plant(fleet_name, mode=0o600)
    elif request.param == "not ours":
        plant(fleet_name, mode=0o644)
    elif request.param == "another user's":
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        plant(fleet_name, mode=0o600, owner=65534)
    yield request.param


#: Each command on a fleet, with the states in which it answers (exit 0, or 1 with
#: "not held" on stdout) instead of failing: a corrupt object is listed as it is, and
#: removed as it is; an shm:// store of a missing fleet is created by joining it.
FLEET_COMMANDS: list[tuple[list[str], set[str]]] = [
    (["list", "{fleet}"], {"corrupt"}),
    (["list", "{fleet}", "--kind", "247"], {"corrupt"}),
    (["locks", "{fleet}"], set()),
    (["locks", "--store", "shm://{fleet}"], {"missing"}),
    (["watch", "{fleet}", "--seconds", "0.1"], set()),
    (["pool", "{fleet}"], set()),
    (["pool", "{fleet}", "--kind", "228"], set()),
    (["pool", "{fleet}", "--kind", "248"], set()),
    (["clear", "{fleet}", "--kind", "228"], {"corrupt", "not ours"}),
    (["force-release", "{fleet}", "jobs", "nightly"], set()),
    (["inspect", "job", "--store", "shm://{fleet}"], {"missing"}),
    (["force-release", "stuck", "--store", "shm://{fleet}"], {"missing"}),
    (["run", "--lock", "nightly", "--store", "shm://{fleet}", "--", "true"], {"missing"}),
]


def check_error(done: subprocess.CompletedProcess[str], status: int) -> list[str]:
    """What is wrong with one error path's result: the status, a line of stderr
    without the prefix, a traceback, a raw kind number (empty: nothing)."""
    argv: list[str] = done.args
    lines = done.stderr.splitlines()
    wrong = []
    if done.returncode != status:
        wrong.append(f"exit {done.returncode}, not {status}")
    if not lines or not all(line.startswith(f"orbit {argv[0]}: ") for line in lines):
        wrong.append("a line without the prefix")
    if "Traceback" in done.stderr:
        wrong.append("a traceback")
    if RAW_KIND.search(done.stderr) is not None:
        wrong.append("a raw kind number")
    return [f"orbit {' '.join(argv)}: {', '.join(wrong)}: {done.stderr!r}"] if wrong else []


def test_each_fleet_command_error_starts_with_orbit_command(
    fleet_name: str, fleet_state: str
) -> None:
    argvs = [[arg.format(fleet=fleet_name) for arg in argv] for argv, _ in FLEET_COMMANDS]
    # The ones that change the fleet run after the ones that read it: clear (kind 228, a
    # lock table's), then those that join the fleet's store (kinds 230 and 231). Run at once,
    # a joiner's membership made clear refuse ("has a live member") under load.
    clearing = [argv for argv in argvs if argv[0] == "clear"]
    joining = [argv for argv in argvs if "--store" in argv]
    reading = [argv for argv in argvs if argv not in clearing + joining]
    results = orbit(*reading) + orbit(*clearing) + orbit(*joining)
    results.sort(key=lambda done: argvs.index(done.args))
    wrong = []
    for done, (_, answers) in zip(results, FLEET_COMMANDS, strict=True):
        if fleet_state in answers:
            assert done.returncode in (0, 1) and done.stderr == "", done
            assert done.returncode == 0 or done.stdout == "not held\n", done
        else:
            wrong += check_error(done, 1)
    assert not wrong, "\n".join(wrong)


def test_clear_of_objects_another_user_owns_names_each_and_exits_1(fleet_name: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    plant(fleet_name, mode=0o600, owner=65534)
    [done] = orbit(["clear", fleet_name, "--all", "--yes"])
    assert check_error(done, 1) == []
    assert len(done.stderr.splitlines()) == len(KINDS)


#: Usage a command refuses, stores it cannot use, commands it cannot run: the status.
OTHER_ERRORS: list[tuple[list[str], int]] = [
    (["locks", "{fleet}", "--store", "sqlite:///{tmp}/x.db"], 2),
    (["clear", "{fleet}", "--all"], 2),
    (["force-release", "a", "b"], 2),
    (["inspect", "job", "--store", "bogus://x"], 2),
    (["locks", "--store", "sqlite://{tmp}/passwd"], 2),
    (["budget", "bogus://x", "n"], 2),
    (["budget", "postgresql://u@127.0.0.1:{port}/db", "n"], 1),
    (["locks", "--store", "postgresql://u@127.0.0.1:{port}/db"], 1),
    (["run", "--lock", "job"], 2),
    # Each its own lock: all of these run at once, and on one lock the second said
    # "held by" (75) instead of its own status.
    (["run", "--lock", "{fleet}-missing", "--", "/nonexistent/command"], 127),
    (["run", "--lock", "{fleet}-not-executable", "--", "{tmp}/passwd"], 126),
]


def test_each_usage_and_store_error_starts_with_orbit_command(
    fleet_name: str, tmp_path: Path
) -> None:
    (tmp_path / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n" * 200)
    port = closed_port()
    argvs = [
        [arg.format(fleet=fleet_name, tmp=tmp_path, port=port) for arg in argv]
        for argv, _ in OTHER_ERRORS
    ]
    wrong = []
    for done, (_, status) in zip(orbit(*argvs), OTHER_ERRORS, strict=True):
        wrong += check_error(done, status)
    assert not wrong, "\n".join(wrong)


def test_argparse_errors_end_with_an_orbit_command_line_and_exit_2() -> None:
    argvs = [
        ["list", "bad/name"],
        ["locks", "bad/name"],
        ["watch", "web", "--seconds", "0"],
        ["pool", "web", "--kind", "999"],
        ["clear", "web", "--kind", "300"],
        ["clear", "bad/name", "--all", "--yes"],
        ["demo", "--workers", "0"],
        ["run", "--lock", "job", "--wait", "-1", "--", "true"],
    ]
    for done in orbit(*argvs):
        assert done.returncode == 2, done
        assert done.stderr.startswith("usage: orbit "), done
        assert done.stderr.splitlines()[-1].startswith(f"orbit {done.args[0]}: error: argument ")
        assert "Traceback" not in done.stderr
