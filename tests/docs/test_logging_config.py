"""The gunicorn logging set-up of ``docs/operations.md`` works as written (issue 24, item 2).

Its ``gunicorn.conf.py`` runs a real gunicorn whose worker loses a store lock to its
TTL; the WARNING the library logs must be in gunicorn's error log, in gunicorn's
format (the worker's pid, the level), and gunicorn's own lines must still be there.
"""

from __future__ import annotations

import re
import sys
import urllib.request
from pathlib import Path

from ._recipes import ROOT, free_port, recipe_env, started, write_recipes

#: A WSGI app whose every request loses a store lock to its TTL.
_APP = """\
import os
import time

from orbitive.store import open_store


def app(environ, start_response):
    with open_store(os.environ["ORBIT_STORE"]) as store:
        lock = store.try_lock("reports/lapsed", "worker", 0.05)
        time.sleep(0.1)  # past its TTL
        lock.release()  # finds it gone: logged
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"done"]
"""


def test_the_gunicorn_logconfig_dict_sends_orbitive_records_to_the_error_log(
    tmp_path: Path,
) -> None:
    files = write_recipes(tmp_path, ROOT / "docs" / "operations.md")
    assert list(files) == ["gunicorn.conf.py"]
    (tmp_path / "app.py").write_text(_APP)
    store = f"sqlite://{tmp_path / 'locks.db'}"
    port = free_port()
    gunicorn = [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "-w", "1"]
    command = [*gunicorn, "-b", f"127.0.0.1:{port}", "app:app"]
    with (
        started(command, tmp_path, recipe_env(tmp_path, store), port),
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30.0) as response,
    ):
        assert response.read() == b"done"
    log = (tmp_path / "server.log").read_text()
    assert re.search(r"\[\d+\] \[INFO\] Booting worker with pid: \d+", log), log  # gunicorn's
    lost = (
        rf"\[\d+\] \[WARNING\] store {re.escape(store)}: lock 'reports/lapsed' \(owner "
        r"'worker', fencing token 1\) is lost: its TTL ran out before it was released"
    )
    assert len(re.findall(lost, log)) == 1, log  # once: not also through the root logger
