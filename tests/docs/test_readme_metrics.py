"""The README's Prometheus sidecar runs as written and serves the fleet's pool and locks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from orbitive import Fleet
from orbitive.clients import ClientPool, PoolOptions
from orbitive.lock import LockKey, LockOwner, LockTable

from ._recipes import ROOT, free_port

_BLOCK = re.compile(r"<!-- file: metrics_sidecar\.py -->\n```python\n(.*?)```", re.DOTALL)


def _get(url: str, deadline: float) -> str:
    """The body of ``url`` once it answers (the sidecar takes a moment to start)."""
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5.0) as response:
                return str(response.read().decode())
        except (urllib.error.URLError, ConnectionError):
            assert time.monotonic() < deadline, f"nothing served at {url}"
            time.sleep(0.1)


def test_the_readme_sidecar_serves_the_fleets_metrics(fleet_name: str, tmp_path: Path) -> None:
    (code,) = _BLOCK.findall((ROOT / "README.md").read_text())
    (tmp_path / "metrics_sidecar.py").write_text(code)
    port = free_port()
    env = dict(os.environ, ORBIT_FLEET=fleet_name, METRICS_PORT=str(port))
    with Fleet.join(fleet_name, 4) as fleet:
        pool: ClientPool[object] = ClientPool(
            fleet, "postgresql://app:secret@db:5432/main", create=object, close=lambda _: None,
            options=PoolOptions(max_live=4),
        )  # fmt: skip
        held = pool.getconn()
        table = LockTable(fleet)
        table.try_acquire(LockKey("readme", "job"), LockOwner(b"me"), 30.0)
        sidecar = subprocess.Popen([sys.executable, str(tmp_path / "metrics_sidecar.py")], env=env)
        try:
            body = _get(f"http://127.0.0.1:{port}/metrics", time.monotonic() + 60.0)
        finally:
            sidecar.terminate()
            sidecar.wait(30)
            pool.putconn(held)
            pool.close()
            table.close()
    name = 'db_client_connection_pool_name="postgresql://app@db:5432/main"'
    used = f'{name},db_client_connection_state="used",fleet="{fleet_name}"'
    assert f"db_client_connection_count{{{used}}} 1.0" in body
    assert f'db_client_connection_max{{{name},fleet="{fleet_name}"}} 4.0' in body
    assert f'orbitive_lock_leases{{fleet="{fleet_name}",table="locks"}} 1.0' in body
    assert "secret" not in body
