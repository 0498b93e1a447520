"""Exclusion never depends on the environment: members whose XDG_RUNTIME_DIR, TMPDIR,
HOME or working folder differ (or who have no environment at all) share one fleet."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orbitive._core._region import SHM_DIR

ROUNDS = 200
MEMBER = Path(__file__).with_name("_env_member.py")
ORBIT = Path(sys.executable).with_name("orbit")


def environments(tmp_path: Path) -> list[tuple[dict[str, str], Path]]:
    """(environment, working folder) of each member: unset, set, another value, none."""
    base = {key: value for key, value in os.environ.items() if key not in ("XDG_RUNTIME_DIR",)}
    folders = []
    for name in ("a", "b"):
        folder = tmp_path / name
        folder.mkdir(mode=0o700, exist_ok=True)
        folders.append(folder)
    first, second = folders
    return [
        (base, tmp_path),
        ({**base, "XDG_RUNTIME_DIR": str(first), "TMPDIR": str(first)}, first),
        (
            {**base, "XDG_RUNTIME_DIR": str(second), "TMPDIR": str(second), "HOME": str(second)},
            second,
        ),
        ({}, Path("/")),
    ]


class Member:
    def __init__(self, fleet: str, environment: dict[str, str], folder: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(MEMBER), fleet, "8"],
            env=environment,
            cwd=folder,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        word, node = self.read().split()
        assert word == "node"
        self.node = int(node)

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def read(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, "the member exited"
        return line.strip()

    def stop(self) -> int:
        self.send("stop")
        return self.process.wait(timeout=30)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def members(tmp_path: Path, fleet_name: str) -> Iterator[list[Member]]:
    started = [Member(fleet_name, env, folder) for env, folder in environments(tmp_path)]
    try:
        yield started
    finally:
        for member in started:
            member.close()


def test_members_of_every_environment_claim_unique_nodes_and_one_holds_the_key(
    members: list[Member],
) -> None:
    assert sorted(member.node for member in members) == list(range(len(members)))
    for round_ in range(ROUNDS):
        for member in members:
            member.send(f"go {round_}")
        answers = [member.read() for member in members]
        holders = [
            m for m, answer in zip(members, answers, strict=True) if answer == f"{round_} acquired"
        ]
        assert len(holders) == 1, (round_, answers)
        assert all(answer.startswith(f"{round_} ") for answer in answers)
        holders[0].send(f"release {round_}")
        assert holders[0].read() == f"{round_} released"
    assert [member.stop() for member in members] == [0] * len(members)


def test_orbit_clear_refuses_from_every_environment_while_a_member_lives(
    members: list[Member], tmp_path: Path, fleet_name: str
) -> None:
    objects = sorted(SHM_DIR.glob(f"orbit-{fleet_name}-*"))
    assert len(objects) == 3  # the membership object, the lock table and its ring
    for environment, folder in environments(tmp_path):
        for extra in (["--kind", "228"], ["--all", "--yes"]):
            done = subprocess.run(
                [str(ORBIT), "clear", fleet_name, *extra],
                env=environment,
                cwd=folder,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode != 0, done
            assert "live member" in done.stderr
            assert sorted(SHM_DIR.glob(f"orbit-{fleet_name}-*")) == objects
    assert [member.stop() for member in members] == [0] * len(members)
    cleared = subprocess.run(
        [str(ORBIT), "clear", fleet_name, "--all", "--yes"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert cleared.returncode == 0, cleared
    assert list(SHM_DIR.glob(f"orbit-{fleet_name}-*")) == []
