"""``orbit tasks``: the keys orbitive.celery's tasks hold, read from a store's lock names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from celery import Celery

from orbitive.celery import Singleton
from orbitive.cli import main
from orbitive.store import open_store

Capture = pytest.CaptureFixture[str]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path}/locks.db"


def _task(url: str) -> Singleton:
    app = Celery("cli", set_as_current=False)
    app.conf.update({"task_always_eager": True, "orbitive_store_url": url})

    @app.task(base=Singleton, name="reports.refresh", unique_on=["customer"])
    def refresh(customer: int) -> None:
        del customer

    return refresh


def test_tasks_lists_running_queued_and_cooling_keys_with_their_task_ids(
    url: str, capsys: Capture
) -> None:
    task = _task(url)
    one, two, three = (task.lock_name((n,), {}) for n in (1, 2, 3))
    with open_store(url) as store:
        running = store.try_lock(one, "id-1 host:42:ab", 60.0)
        queued = store.try_lock(f"{two}/queued", "id-2", 600.0)
        cooling = store.try_lock(f"{three}/cooldown", "id-3", 30.0)
        other = store.try_lock("jobs/nightly", "cron", 60.0)
        assert running and queued and cooling and other
        assert main(["tasks", "--store", url, "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)["tasks"]
        by_id = {row["task_id"]: row for row in shown}
        assert set(by_id) == {"id-1", "id-2", "id-3"}  # jobs/nightly is no task's
        assert by_id["id-1"]["state"] == "running" and by_id["id-1"]["process"] == "host:42:ab"
        assert by_id["id-1"]["fencing_token"] == running.fencing_token
        assert (by_id["id-2"]["state"], by_id["id-2"]["process"]) == ("queued", "")
        assert by_id["id-3"]["state"] == "cooling"
        assert {row["task"] for row in shown} == {"reports.refresh"}
        assert by_id["id-1"]["key"] == one.rsplit("/", 1)[1]
        assert main(["tasks", "--store", url]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0].split()[:3] == ["task", "key", "state"]
        assert out[-1].startswith("3 task key(s) held in ")
        assert main(["tasks", "--store", url, "--prefix", "other"]) == 0
        assert capsys.readouterr().out.splitlines()[-1].startswith("0 task key(s)")


def test_tasks_on_a_url_open_store_refuses_is_a_usage_error(capsys: Capture) -> None:
    assert main(["tasks", "--store", "bogus://x"]) == 2
    assert capsys.readouterr().err.startswith("orbit tasks: ")
