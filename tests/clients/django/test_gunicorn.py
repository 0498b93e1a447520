"""The Django page's example under real gunicorn: 4 workers share a host-wide cap of 3,
in session mode and in transaction mode.

The test takes the example's files out of docs/django.md as written (settings,
model, view, URL, migration, WSGI entry, gunicorn settings), adds the packages'
empty ``__init__.py`` files as the page's ``touch`` does, checks that the
migration is the model's, creates the table with it and runs
gunicorn with 4 workers and ``DB_MAX_LIVE=3``. Eight client threads buy from
two rows: every request must be answered, every count taken exactly once (the
view's ``select_for_update()`` serialises the buyers of a row), and the
server must never show more than 3 connections to the database. With
``--preload`` the master also queries before it forks, and leaves its
connection open: the workers must neither use it nor break it (in session mode, its
server session outlives the load).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Final

import psycopg
import pytest

from ..._processes import ROOT
from ..._servers import TempPostgres
from ...docs._recipes import free_port, started, write_recipes
from .._sampling import ServerConnections

WORKERS: Final = 4
MAX_LIVE: Final = 3
THREADS: Final = 8
BUYS_PER_THREAD: Final = 40
STOCK: Final = 1_000

#: What the page's ``touch`` makes: the packages' ``__init__.py`` files.
PACKAGES: Final = ("mysite/__init__.py", "shop/__init__.py", "shop/migrations/__init__.py")
#: The page's files: settings, model, view, URL, migration, WSGI entry and gunicorn's.
PAGE_FILES: Final = {
    "mysite/settings.py",
    "mysite/wsgi.py",
    "shop/models.py",
    "shop/views.py",
    "shop/urls.py",
    "shop/migrations/0001_initial.py",
    "gunicorn.conf.py",
}

#: gunicorn settings for the preloading run: the page's, plus a master that queries.
PRELOAD_CONF: Final = """\
exec(open("gunicorn.conf.py").read())
preload_app = True


def when_ready(server):  # in the master, after the app is loaded, before the workers fork
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        open("master-backend", "w").write(str(cursor.fetchone()[0]))
"""


def _site(directory: Path) -> None:
    files = write_recipes(directory, ROOT / "docs" / "django.md")
    assert set(files) == PAGE_FILES, sorted(files)
    for name in PACKAGES:
        (directory / name).touch()
    (directory / "preload.conf.py").write_text(PRELOAD_CONF)


def _buy(port: int, sku: str) -> int:
    url = f"http://127.0.0.1:{port}/buy/{sku}"
    with urllib.request.urlopen(url, timeout=60.0) as response:
        assert response.status == 200
        body: dict[str, object] = json.loads(response.read())
    assert body["sku"] == sku
    count = body["count"]
    assert isinstance(count, int)
    return count


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["session", "transaction"])
@pytest.mark.parametrize("preload", [False, True], ids=["fork-per-worker", "preload"])
def test_the_django_example_serves_every_buy_within_three_server_connections(
    tmp_path: Path,
    postgres_server: TempPostgres,
    database: str,
    fleet_name: str,
    preload: bool,
    mode: str,
) -> None:
    _site(tmp_path)
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = dict(
        os.environ,
        PATH=path,
        PYTHONPATH=str(tmp_path),
        DJANGO_SETTINGS_MODULE="mysite.settings",
        DJANGO_SECRET_KEY="not-a-secret",
        DB_NAME=database,
        DB_USER="postgres",
        DB_HOST="127.0.0.1",
        DB_PORT=str(postgres_server.port),
        DB_FLEET=fleet_name,
        DB_MAX_LIVE=str(MAX_LIVE),
        DB_POOL_MODE=mode,
    )
    django = [sys.executable, "-m", "django"]
    for command in (["makemigrations", "--check", "--dry-run", "shop"], ["migrate", "-v", "0"]):
        # the page's migration is the model's (makemigrations finds nothing to write)
        done = subprocess.run(
            [*django, *command], cwd=tmp_path, env=env, capture_output=True, check=False
        )
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode(errors="replace")
    url = postgres_server.url.rsplit("/", 1)[0] + f"/{database}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO shop_stock (sku, count) VALUES ('a', %s), ('b', %s)", (STOCK, STOCK)
        )

    port = free_port()
    conf = "preload.conf.py" if preload else "gunicorn.conf.py"
    command = [sys.executable, "-m", "gunicorn", "-c", conf, "-w", str(WORKERS)]
    command += ["-b", f"127.0.0.1:{port}", "--timeout", "60", "--no-control-socket"]
    bought: dict[str, list[int]] = {"a": [], "b": []}
    failures: list[str] = []
    lock = threading.Lock()

    def load(thread: int) -> None:
        for turn in range(BUYS_PER_THREAD):
            sku = "ab"[(thread + turn) % 2]
            try:
                count = _buy(port, sku)
            except Exception as error:
                with lock:
                    failures.append(repr(error))
                continue
            with lock:
                bought[sku].append(count)

    with (
        started([*command, "mysite.wsgi"], tmp_path, env, port),
        ServerConnections(postgres_server.url, database, column="datname") as server,
    ):
        threads = [threading.Thread(target=load, args=(n,)) for n in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(240)
        if preload and mode == "session":  # the master's connection outlived the load
            # (in transaction mode its query ran on a server connection of the fleet's,
            # which the pool may close as it closes any; the master's own connection is
            # to its router)
            master = int((tmp_path / "master-backend").read_text())
            alive = "SELECT state FROM pg_stat_activity WHERE pid = %s"
            with psycopg.connect(postgres_server.url, autocommit=True) as conn:
                row = conn.execute(alive, (master,)).fetchone()
            assert row is not None and row[0] == "idle", row
    assert failures == []
    assert sum(map(len, bought.values())) == THREADS * BUYS_PER_THREAD
    for counts in bought.values():  # each count was taken once: no lost update
        assert sorted(counts) == list(range(STOCK - len(counts), STOCK)), Counter(counts)
    with psycopg.connect(url, autocommit=True) as conn:
        rows: dict[str, int] = dict(conn.execute("SELECT sku, count FROM shop_stock").fetchall())
    assert rows == {sku: STOCK - len(counts) for sku, counts in bought.items()}
    assert server.samples > 10
    assert 1 <= server.highest <= MAX_LIVE, server.highest
