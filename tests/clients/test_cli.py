"""``orbit pool`` shows a client pool's key as PgBouncer's SHOW POOLS does, dead owners apart;
``orbit budget`` shows the hosts of a budget."""

from __future__ import annotations

import json
import secrets
import signal
import time

import pytest

from orbitive import Fleet
from orbitive.cli import main
from orbitive.clients import Budget, PoolOptions
from orbitive.clients.psycopg import ConnectionPool

from .._children import lock_table_member
from .._processes import Processes
from .._servers import TempPostgres
from ._workers import fake_holder
from .conftest import CAPACITY


def _key_row(out: str) -> list[str]:
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.strip().startswith("KEY"))
    return lines[header + 1].split()


def test_orbit_pool_counts_live_idle_in_use_and_then_the_dead_owner(
    spawned: Processes, fleet_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    holder = spawned.start(fake_holder, fleet_name, CAPACITY, 2, 1)
    assert holder.recv(60) == 2
    assert main(["pool", fleet_name]) == 0
    out = capsys.readouterr().out
    assert "LIVE  IDLE  IN USE  WAITING  CREATING  DEAD" in out
    # KEY, LIVE, IDLE, IN USE, WAITING, CREATING, DEAD
    assert _key_row(out)[1:7] == ["3", "1", "2", "0", "0", "0"]
    assert holder.kill() == -signal.SIGKILL
    assert main(["pool", fleet_name]) == 0
    assert _key_row(capsys.readouterr().out)[1:7] == ["0", "0", "0", "0", "0", "3"]


def test_orbit_pool_counts_a_dead_owner_whose_node_a_process_without_a_pool_took(
    spawned: Processes, fleet_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    holder = spawned.start(fake_holder, fleet_name, CAPACITY, 2, 1)
    assert holder.recv(60) == 2
    assert holder.kill() == -signal.SIGKILL
    member = spawned.start(lock_table_member, fleet_name, CAPACITY)
    node, _ = member.recv(60)  # the dead owner's node, held by a process with no pool
    assert main(["pool", fleet_name]) == 0
    out = capsys.readouterr().out
    assert _key_row(out)[1:7] == ["0", "0", "0", "0", "0", "3"]
    assert f"node {node} (incarnation" in out and "alive" not in out  # members and owners


def test_orbit_budget_shows_each_host_with_its_units_clients_and_lease_deadlines(
    fleet: Fleet, durable_postgres_server: TempPostgres, capsys: pytest.CaptureFixture[str]
) -> None:
    db, name = durable_postgres_server.url, f"db-{secrets.token_hex(3)}"
    assert main(["budget", db, name]) == 1  # no host yet
    assert "no host holds units" in capsys.readouterr().err
    budget = Budget(db, name=name, total=5, ttl=4.0, handover_within=0.4)
    options = PoolOptions(max_live=3)
    pool = ConnectionPool(db, fleet=fleet, options=options, budget=budget)
    with pool, pool.connection(), pool.connection():
        deadline = time.monotonic() + 10.0
        row: list[str] = []
        while time.monotonic() < deadline:  # the post follows within handover_within / 4
            assert main(["budget", db, name]) == 0
            out = capsys.readouterr().out
            row = _budget_row(out)
            if row[1:7] == ["2", "2", "0", "0", "0", "3"]:
                break
            time.sleep(0.05)
        # HOST, UNITS, IN USE, IDLE, WAITING, NEED, MAX LIVE, LEASES LEFT S
        assert row[1:7] == ["2", "2", "0", "0", "0", "3"], out
        assert f"budget {name!r}: total 5, 2 units held by 1 hosts" in out
        soonest, latest = (float(part) for part in row[7].split(".."))
        assert 0.0 < soonest <= latest <= 4.0
        assert main(["budget", db, name, "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
    assert (shown["budget"], shown["totals"], shown["units"]) == (name, [5], 2)
    (host,) = shown["hosts"]
    assert (host["units"], host["in_use"], host["idle"], host["max_live"]) == (2, 2, 0, 3)
    assert len(host["leases_left_s"]) == 2


def test_orbit_budget_refuses_a_bad_url_or_name_and_names_an_unreachable_coordinator(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["budget", "sqlite:///tmp/x.db", "main-db"]) == 2
    assert "PostgreSQL or Redis URL" in capsys.readouterr().err
    assert main(["budget", "postgresql://postgres@127.0.0.1:9/postgres", "a\nb"]) == 2
    assert "control characters" in capsys.readouterr().err
    assert main(["budget", "postgresql://postgres@127.0.0.1:9/postgres?timeout=1", "db"]) == 1
    assert capsys.readouterr().err.startswith("orbit budget: ")


def _budget_row(out: str) -> list[str]:
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.strip().startswith("HOST"))
    return lines[header + 1].split()
