"""The Celery prefork and cron recipes of docs/recipes.md, run for real (issue 12 item 6).

Celery runs a real worker with the prefork pool; its broker and result backend
are kombu's filesystem transport and Celery's file backend in the test's
directory, so no broker server is needed. The cron recipe runs the crontab
line's command through ``sh`` twice at once, as two overlapping cron runs would.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from .._fleets import new_fleet_name, remove_fleet_files
from ._recipes import CAPACITY, assert_one_holder_at_a_time, live_nodes, recipe_env, started
from ._recipes import write_recipes as write_recipe_files

POOL = 2
#: cron's own PATH (cron(8) sets PATH=/usr/bin:/bin for the jobs it runs).
CRON_PATH = "/usr/bin:/bin"
TASKS = 6
#: A Celery configuration with a broker and a backend that are plain directories.
_CONFIG = """\
broker_url = "filesystem://"
broker_transport_options = {{"data_folder_in": "{q}", "data_folder_out": "{q}",
                            "processed_folder": "{done}", "store_processed": False}}
result_backend = "file://{results}"
broker_connection_retry_on_startup = True
worker_hijack_root_logger = False
"""
_CLIENT = """\
import json, celery_app
pending = [celery_app.rebuild.delay("nightly") for _ in range({tasks})]
print(json.dumps([result.get(timeout=60) for result in pending]))
"""


def _celery_config(directory: Path) -> None:
    folders = {name: directory / name for name in ("q", "done", "results")}
    for folder in folders.values():
        folder.mkdir()
    (directory / "celeryconfig.py").write_text(_CONFIG.format(**folders))


def test_celery_prefork_children_open_the_store_in_worker_process_init(tmp_path: Path) -> None:
    write_recipe_files(tmp_path)
    _celery_config(tmp_path)
    fleet = new_fleet_name()
    env = recipe_env(
        tmp_path, f"shm://{fleet}?capacity={CAPACITY}", CELERY_CONFIG_MODULE="celeryconfig"
    )
    command = [sys.executable, "-m", "celery", "-A", "celery_app", "worker"]
    command += ["--pool=prefork", f"--concurrency={POOL}", "--loglevel=warning"]
    try:
        with started(command, tmp_path, env) as worker:
            client = subprocess.run(
                [sys.executable, "-c", _CLIENT.format(tasks=TASKS)],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=90,
                check=False,
            )
            assert client.returncode == 0, client.stderr[-3000:]
            done = json.loads(client.stdout)
            assert len(done) == TASKS
            assert worker.pid not in {one["pid"] for one in done}  # the pool's children ran them
            assert live_nodes(fleet) == POOL  # one node per child; the main process took none
    finally:
        remove_fleet_files(fleet)
    assert_one_holder_at_a_time(done)


def _cron_command(crontab: str, script: Path) -> str:
    """The command of the recipe's crontab line, with the script and this environment's
    ``orbit`` put in their places."""
    (line,) = [line for line in crontab.splitlines() if line and not line.startswith("#")]
    command = re.split(r"\s+", line, maxsplit=5)[5]
    orbit = str(Path(sys.executable).with_name("orbit"))
    return command.replace("/opt/reports/nightly.sh", str(script)).replace(
        "/srv/app/.venv/bin/orbit", orbit
    )


def test_cron_line_runs_once_and_an_overlapping_run_exits_quietly(tmp_path: Path) -> None:
    files = write_recipe_files(tmp_path)
    script = tmp_path / "nightly.sh"
    script.write_text('#!/bin/sh\necho "$ORBIT_FENCING_TOKEN" >> "$RUNS"\nsleep 2\n')
    script.chmod(0o755)
    runs = tmp_path / "runs.txt"
    env = recipe_env(tmp_path, "", XDG_STATE_HOME=str(tmp_path / "state"), RUNS=str(runs))
    env["PATH"] = CRON_PATH  # the line runs with nothing else on its PATH, as under cron
    command = ["sh", "-c", _cron_command(files["crontab"], script)]
    overlapping = [subprocess.Popen(command, env=env) for _ in range(2)]
    codes = [run.wait(60) for run in overlapping]
    assert codes == [0, 0]  # the skipped run exits 75, which the line turns into success
    assert len(runs.read_text().split()) == 1  # exactly one of them ran the script
    assert subprocess.run(command, env=env, timeout=60, check=False).returncode == 0
    first, second = (int(token) for token in runs.read_text().split())
    assert second > first  # the next night's run holds a larger fencing token
