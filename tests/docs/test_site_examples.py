"""Every code block of the documentation site and the README runs (issue 24, items 1 and 4).

Each page's blocks run in order as one program (:mod:`tests.docs._site_run`), in a
private mount namespace: a ``/dev/shm`` of its own, and an ``/etc/hosts`` where the
docs' host names ``db`` and ``cache`` are this machine, with ``PGPORT`` leading to the
session's throw-away PostgreSQL server. So the examples run as written, and meet no
other test run's fleets.

Item 4: the docs' examples can run one after another on one machine, in any order.
:func:`test_every_page_runs_after_the_others_in_a_shuffled_order` runs every page
in one such namespace, in an order drawn from a seed it reports (``ORBIT_DOCS_SEED``
repeats one), leaving each page's fleets, leases and state behind for the next, as
a reader trying them all on one machine would.
"""

from __future__ import annotations

import functools
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from .._servers import TempPostgres
from ._site import LANGUAGES, NOT_RUN_MOST, ROOT, Block, every_block, page_path, runnable_pages
from ._standins import STANDINS

#: The roles and databases the docs' connection strings name.
DATABASES = {"main": "app", "ops": "cron", "shop": "shop"}
HOSTS = "127.0.0.1 localhost db cache\n::1 localhost\n"
_PRIVATE_SHM = (
    'mount -t tmpfs -o mode=1777,size=1g orbitive-docs /dev/shm && mount --bind "$0" /etc/hosts'
    ' && exec "$@"'
)

RunPages = Callable[[list[str]], subprocess.CompletedProcess[str]]


@functools.cache
def _unshare() -> list[str] | None:
    """How to enter a private mount namespace here, or None if it cannot be done."""
    prefix = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-Urm"]
    if shutil.which("unshare") is None:
        return None
    probe = subprocess.run([*prefix, "true"], capture_output=True, check=False)
    return prefix if probe.returncode == 0 else None


def in_private_shm(argv: list[str], hosts: Path) -> list[str]:
    """``argv`` run with a private ``/dev/shm`` and ``hosts`` as its ``/etc/hosts``."""
    prefix = _unshare()
    if prefix is None:
        message = "needs a private mount namespace (unshare -m as root, or unshare -Urm)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return [*prefix, "sh", "-c", _PRIVATE_SHM, str(hosts), *argv]


def _databases(server: TempPostgres) -> None:
    with psycopg.connect(server.url, autocommit=True) as conn:
        for database, role in DATABASES.items():
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone() is None:
                conn.execute(f'CREATE ROLE "{role}" LOGIN')
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database])
            if found.fetchone() is None:
                conn.execute(f'CREATE DATABASE "{database}" OWNER "{role}"')


@pytest.fixture
def run_pages(postgres_server: TempPostgres, tmp_path: Path) -> Iterator[RunPages]:
    """Run pages, in the order given, on one private machine: one ``/dev/shm``, one
    state folder, one PostgreSQL."""
    _databases(postgres_server)
    hosts = tmp_path / "hosts"
    hosts.write_text(HOSTS)
    port = postgres_server.url.rsplit(":", 1)[1].split("/", 1)[0]
    bin_dir = str(Path(sys.executable).parent)
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("ORBIT_", "PG", "XDG_STATE")) and key != "PYTHONPATH"
    }
    env.update(
        PATH=os.pathsep.join([bin_dir, env.get("PATH", "")]),
        PGPORT=port,
        PYTHONPATH=str(ROOT),
        XDG_STATE_HOME=str(tmp_path / "state"),
    )

    def run(pages: list[str]) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "tests.docs._site_run", "pages", str(tmp_path / "work")]
        return subprocess.run(
            in_private_shm([*argv, *pages], hosts),
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )

    yield run


def test_every_block_has_a_language_the_test_knows() -> None:
    unknown = [
        f"{block.where}: {block.language or 'no language'}"
        for block in every_block()
        if block.language not in LANGUAGES and block.marker != "file"
    ]
    assert unknown == []


def test_not_run_markers_are_rare_and_say_why() -> None:
    not_run = [block for block in every_block() if block.marker == "not-run"]
    assert len(not_run) <= NOT_RUN_MOST, [block.where for block in not_run]
    for block in not_run:
        assert len(block.argument.split()) >= 6, f"{block.where}: give the reason"
        assert block.language != "python", f"{block.where}: a Python example must run"


def test_server_markers_start_shell_commands_and_name_their_url() -> None:
    for block in every_block():
        if block.marker == "server":
            assert block.language == "sh", block.where
            assert re.fullmatch(r"http://127\.0\.0\.1:8000/\S*", block.argument), block.where


def _prose(page: str) -> str:
    return re.sub(r"```.*?```", "", page_path(page).read_text(), flags=re.DOTALL)


def test_each_stand_in_is_named_as_one_on_its_page() -> None:
    for page, source in STANDINS.items():
        prose = _prose(page)
        assert re.search(r"stands? for", prose), page
        names = re.findall(r"^(?:def |class )?([A-Za-z_]\w*)\b", source, re.MULTILINE)
        for name in {name for name in names if not name.startswith("_")} - {"return"}:
            if any(name in block.code for block in _blocks_of(page)):
                assert f"`{name}" in prose, f"{page}: {name} is not said to be the reader's"


def _blocks_of(page: str) -> list[Block]:
    return [block for block in every_block() if block.page == page]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", runnable_pages())
def test_page_runs_as_written(page: str, run_pages: RunPages) -> None:
    done = run_pages([page])
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_page_runs_after_the_others_in_a_shuffled_order(run_pages: RunPages) -> None:
    seed = int(os.environ.get("ORBIT_DOCS_SEED") or random.SystemRandom().randrange(10**6))
    pages = runnable_pages()
    random.Random(seed).shuffle(pages)
    print(f"ORBIT_DOCS_SEED={seed}: {' '.join(pages)}")
    done = run_pages(pages)
    assert done.returncode == 0, (
        f"ORBIT_DOCS_SEED={seed} (order: {' '.join(pages)})\n{done.stdout}{done.stderr}"
    )
