"""Issue 32's Django mix under gunicorn at saturation, in transaction mode.

8 sync workers share ``max_live`` 2 server connections; 16 client threads send
2,000 requests mixing plain reads, ``atomic()`` writes under
``select_for_update()``, a savepoint rolled back inside a kept transaction, and
``.iterator()`` inside and outside ``atomic()`` (``tests/clients/django/mix_site``).
Every request must be answered; every committed row must be there once, no row of
a rolled-back savepoint at all, every raise of the locked tally taken once; and the
server, sampled throughout, must never show more than 2 sessions on the database.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any, Final

import psycopg
import pytest

from ..._processes import ROOT
from ..._servers import TempPostgres
from ...docs._recipes import free_port, started
from .._sampling import ServerConnections

WORKERS: Final = 8
MAX_LIVE: Final = 2
THREADS: Final = 16
REQUESTS: Final = 2_000
#: Request ``i`` is ``MIX[i % len(MIX)]``: reads, writes, savepoints, and iterations
#: outside and inside ``atomic()``.
MIX: Final = ("read", "read", "read", "write", "write", "savepoint", "iterate/0", "iterate/1")
TABLES: Final = """
CREATE TABLE mix_entry (id bigserial PRIMARY KEY, request varchar(40) NOT NULL UNIQUE);
CREATE TABLE mix_tally (id bigserial PRIMARY KEY, name varchar(20) NOT NULL UNIQUE,
                        value integer NOT NULL);
INSERT INTO mix_tally (name, value) VALUES ('writes', 0);
"""


def _get(port: int, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/{path}", timeout=60.0) as response:
        assert response.status == 200
        body: dict[str, Any] = json.loads(response.read())
    return body


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_mix_under_gunicorn_keeps_every_commit_and_the_cap_in_transaction_mode(
    tmp_path: Path, postgres_server: TempPostgres, database: str, fleet_name: str
) -> None:
    url = postgres_server.url.rsplit("/", 1)[0] + f"/{database}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(TABLES)
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = dict(
        os.environ,
        PATH=path,
        PYTHONPATH=str(ROOT),
        MIX_DB_NAME=database,
        MIX_DB_PORT=str(postgres_server.port),
        MIX_FLEET=fleet_name,
        MIX_MAX_LIVE=str(MAX_LIVE),
        MIX_MODE="transaction",
    )
    port = free_port()
    command = [sys.executable, "-m", "gunicorn", "-w", str(WORKERS), "-b", f"127.0.0.1:{port}"]
    command += ["--timeout", "60", "--no-control-socket", "tests.clients.django.mix_site.wsgi"]
    numbers = itertools.count()
    lock = threading.Lock()
    failures: list[str] = []
    tallies: list[int] = []
    kept: list[str] = []

    def load() -> None:
        while (n := next(numbers)) < REQUESTS:
            kind = MIX[n % len(MIX)]
            rid = f"r{n}"
            path = f"{kind}/{rid}" if kind in ("write", "savepoint") else kind
            try:
                body = _get(port, path)
            except Exception as error:
                with lock:
                    failures.append(f"{path}: {error!r}")
                continue
            with lock:
                if kind in ("write", "savepoint"):
                    kept.append(rid)
                if kind == "write":
                    tallies.append(body["tally"])

    with (
        started(command, tmp_path, env, port),
        ServerConnections(postgres_server.url, database, column="datname") as server,
    ):
        threads = [threading.Thread(target=load) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(500)
    assert failures == []
    writes = sum(1 for n in range(REQUESTS) if MIX[n % len(MIX)] == "write")
    assert sorted(tallies) == list(range(1, writes + 1))  # each raise taken once
    with psycopg.connect(url, autocommit=True) as conn:
        rows = [row[0] for row in conn.execute("SELECT request FROM mix_entry").fetchall()]
        tally = conn.execute("SELECT value FROM mix_tally").fetchone()
    assert sorted(rows) == sorted(kept)  # every commit there once, nothing rolled back
    assert tally == (writes,)
    assert server.samples > 10
    assert 1 <= server.highest <= MAX_LIVE, server.highest
