"""``orbit clear``: only this fleet's objects, only ours, and never a traceback.

Planted names are what another local user can put in the sticky ``/dev/shm``
under our uid's pattern: a file where an object of ours would be, a
``.creating-`` name. The clear removes what is ours and names each one it
leaves; a fleet whose name is ours plus a suffix (``web`` and ``web-2``) is
another fleet.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from orbitive import Fleet
from orbitive._core._region import CREATING, SHM_DIR, object_name, router_folder_name
from orbitive.cli import main
from orbitive.store import open_store

from .._capabilities import NEEDS_ROOT
from .._processes import Channel, Processes
from ..clients._workers import remote_owner
from ..clients.test_remote import EchoServer, echo_server

__all__ = ["echo_server"]

#: The user the clear runs as, and the user that plants names under its pattern.
CLEARER_UID = 4343
OTHER_UID = 4242
#: A process id no process has (above the kernel's pid_max limit of 2**22).
DEAD_PID = 1 << 23


def _plant(path: Path, uid: int) -> Path:
    path.write_bytes(b"\0" * 64)
    path.chmod(0o600)
    os.chown(path, uid, uid)
    return path


def clear_as(channel: Channel, uid: int, fleet: str) -> None:
    """In a forked child: become ``uid``, run ``orbit clear FLEET --all --yes``; send
    (exit status or the exception's class name, stderr)."""
    os.setgid(uid)
    os.setuid(uid)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            status: int | str = main(["clear", fleet, "--all", "--yes"])
    except BaseException as error:  # a traceback for the user: the test reports it
        status = type(error).__name__
    channel.send((status, err.getvalue()))


@NEEDS_ROOT
@pytest.mark.parametrize("planted", ["object", "creation", "both"])
def test_clear_names_and_leaves_what_another_user_planted_and_removes_the_rest(
    fleet_name: str, planted: str
) -> None:
    suffix = f"-{CLEARER_UID}"
    names = {
        "object": f"orbit-{fleet_name}-228{suffix}",
        "creation": f"orbit-{fleet_name}-229{suffix}{CREATING}{DEAD_PID}-0a0b",
    }
    foreign = [
        _plant(SHM_DIR / names[kind], OTHER_UID) for kind in names if planted in (kind, "both")
    ]
    ours = _plant(SHM_DIR / f"orbit-{fleet_name}-247{suffix}", CLEARER_UID)
    with Processes("fork") as started:
        status, err = started.start(clear_as, CLEARER_UID, fleet_name).recv()
    assert status == 1, (status, err)
    assert not ours.exists()  # ours went, the planted names stayed and were named
    assert all(path.exists() for path in foreign)
    lines = err.splitlines()
    assert len(lines) == len(foreign), err
    for path, line in zip(foreign, lines, strict=True):
        assert line.startswith(f"orbit clear: not removing {str(path)!r}: owned by uid 4242")


def test_clear_of_a_fleet_leaves_the_leftovers_of_a_fleet_named_with_a_suffix(
    fleet_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    other = f"{fleet_name}-2"
    with Fleet.join(fleet_name, 2), Fleet.join(other, 2):
        pass  # both fleets have their membership objects
    leftover = SHM_DIR / f"{object_name(other, 228)}{CREATING}{DEAD_PID}-0a0b"
    _plant(leftover, os.geteuid())
    assert main(["clear", fleet_name, "--all", "--yes"]) == 0
    assert leftover.exists()
    assert main(["clear", other, "--all", "--yes"]) == 0
    assert not leftover.exists()
    assert "removed 2 object(s)" in capsys.readouterr().out


def test_clear_removes_the_socket_of_a_killed_remote_owner(
    fleet_name: str, echo_server: EchoServer
) -> None:
    port = echo_server.server_address[1]
    with Processes("spawn") as started:
        owner = started.start(remote_owner, fleet_name, 4, port, False)
        assert owner.recv(60) == "ready"
        sockets = list(SHM_DIR.glob(f"orbit-{fleet_name}-*.sock"))
        assert len(sockets) == 1
        assert owner.kill() == -signal.SIGKILL
    assert sockets[0].exists()  # a SIGKILL leaves it
    assert main(["clear", fleet_name, "--all", "--yes"]) == 0
    assert not sockets[0].exists()


def semaphore_waiter(channel: Channel, url: str) -> None:
    """Wait for the only slot of semaphore "one" of the SHM store at ``url`` (held by
    the test): the wait watches the table's readiness socket until the process dies."""
    with open_store(url) as store:
        channel.send("open")
        store.semaphore("one", 1).acquire("waiter", 30.0)


def test_clear_removes_the_readiness_socket_of_a_killed_waiter(
    fleet_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"shm://{fleet_name}?capacity=4"
    with Processes("spawn") as started, open_store(url) as store:
        held = store.semaphore("one", 1).try_acquire("holder", 30.0)
        assert held is not None
        waiter = started.start(semaphore_waiter, url)
        assert waiter.recv(60) == "open"
        deadline = time.monotonic() + 30.0
        while not (sockets := readiness_sockets(fleet_name)) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(sockets) == 1  # the waiter's: the test's store made none
        assert waiter.kill() == -signal.SIGKILL
        held.release()
    assert sockets[0].exists()  # a SIGKILL leaves it
    assert main(["list", fleet_name]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if sockets[0].name in line]
    assert len(listed) == 1 and listed[0].endswith("readiness socket of node 1")
    assert main(["clear", fleet_name, "--all", "--yes"]) == 0
    assert list(SHM_DIR.glob(f"orbit-{fleet_name}-*")) == []


def readiness_sockets(fleet: str) -> list[Path]:
    """The readiness sockets of ``fleet`` in ``/dev/shm``."""
    return [path for path in SHM_DIR.glob(f"orbit-{fleet}-*") if path.is_socket()]


def _router_leftover(fleet: str, port: int) -> Path:
    """A router's folder as a killed process leaves it: its listening socket still bound
    to a name (a SIGKILL unlinks nothing)."""
    folder = SHM_DIR / router_folder_name(fleet, 231, 3)
    folder.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(folder / f".s.PGSQL.{port}"))
    return folder


def test_clear_removes_the_folder_and_socket_of_a_killed_router(fleet_name: str) -> None:
    folder = _router_leftover(fleet_name, 6432)
    assert main(["clear", fleet_name, "--all", "--yes"]) == 0
    assert not folder.exists()


@pytest.mark.parametrize("planted", ["file", "symlink"])
def test_clear_leaves_a_router_folder_holding_what_no_router_makes_and_names_it(
    fleet_name: str, planted: str, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _router_leftover(fleet_name, 6432)
    odd = folder / ".s.PGSQL.6433"
    if planted == "file":
        odd.write_bytes(b"")
    else:
        odd.symlink_to("/etc/passwd")
    try:
        assert main(["clear", fleet_name, "--all", "--yes"]) == 1
        assert odd.is_symlink() or odd.is_file()
        err = capsys.readouterr().err
        assert f"not removing {str(odd)!r}: not a file or socket orbitive makes" in err
    finally:
        odd.unlink()
        for leftover in folder.iterdir():
            leftover.unlink()
        folder.rmdir()
