"""Simulated hosts for the budget tests: each its own shared memory, some their own network.

A :class:`Host` runs ``tests/clients/_budget_host.py`` (a host main and its
workers) in a mount namespace of its own with a private tmpfs on ``/dev/shm``
(``unshare --mount``, as root), so its fleet cannot meet the other hosts'
through shared memory: every host uses the same fleet name, and each still
sees only its own. Where namespaces are not available the hosts run in this
one with fleet names of their own (:data:`ISOLATED` says which). With a
:class:`Link`, the host also runs in a network namespace of its own and reaches
PostgreSQL over a veth pair.

The test steers a host through its mode file (``busy``, ``idle``, ``stop``) and
reads what its workers write (:meth:`Host.stats`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[2]
#: The budgets' ttl and hand-over bound in these tests, in seconds.
TTL: Final = 3.0
HANDOVER: Final = 2.0
#: Mount the private /dev/shm, then run the host (its command follows as "$@").
_PRIVATE_SHM: Final = 'mount -t tmpfs -o size=64m,mode=1777 tmpfs /dev/shm && exec "$@"'


def _probe_namespaces() -> bool:
    """Whether this process may run a command with a private /dev/shm of its own."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", _PRIVATE_SHM, "sh", "true"],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


#: Whether hosts get a private /dev/shm each (else fleet names of their own).
ISOLATED: Final = _probe_namespaces()


def _probe_netns() -> bool:
    if not ISOLATED or shutil.which("ip") is None:
        return False
    name = f"orbit-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, check=False)
    if made.returncode != 0:
        return False
    subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)
    return True


#: Whether hosts can get a network namespace each (root, iproute2).
NETNS: Final = _probe_netns()


@dataclass
class Link:
    """A network namespace and a veth pair: the host side ``outside``, the namespace's
    side ``inside`` (addresses in 10.77.N.0/24)."""

    name: str
    number: int

    @property
    def outside(self) -> str:
        return f"10.77.{self.number}.1"

    @property
    def inside(self) -> str:
        return f"10.77.{self.number}.2"

    def up(self) -> None:
        """Create the namespace and the pair, with addresses, up."""
        tail = os.getpid() % 10000
        veth, peer = f"vo{self.number}-{tail}", f"vi{self.number}-{tail}"
        inside = ["ip", "netns", "exec", self.name, "ip"]
        for command in (
            ["ip", "netns", "add", self.name],
            ["ip", "link", "add", veth, "type", "veth", "peer", "name", peer],
            ["ip", "link", "set", peer, "netns", self.name],
            ["ip", "addr", "add", f"{self.outside}/24", "dev", veth],
            ["ip", "link", "set", veth, "up"],
            [*inside, "addr", "add", f"{self.inside}/24", "dev", peer],
            [*inside, "link", "set", peer, "up"],
            [*inside, "link", "set", "lo", "up"],
        ):
            subprocess.run(command, check=True, capture_output=True)
        self._veth = veth

    def down(self) -> None:
        """Delete the namespace (its end of the pair goes with it, and so does ours)."""
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True, check=False)
        with contextlib.suppress(AttributeError):
            subprocess.run(["ip", "link", "delete", self._veth], capture_output=True, check=False)


def wait_for(predicate: Callable[[], bool], timeout: float) -> float:
    """Poll ``predicate`` every 10 ms; the monotonic time it first held.

    Raises:
        AssertionError: it did not hold within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(0.01)
    raise AssertionError(f"not within {timeout} s")


class Host:
    """One simulated host: a host main and ``workers`` processes (see the module).

    Args:
        name: the host's name (its folder and, without namespaces, its fleet).
        db: the URL its pools connect to.
        budget: the ``Budget`` arguments, or None: the host is capped by ``max_live`` alone
            (a static per-host cap, ``bench/budget_bench.py``'s baseline).
        options: the ``PoolOptions`` arguments.
        tag: the ``application_name`` of its connections.
        workers: its worker processes.
        statement: what one request runs.
        timeout: a request's checkout timeout, seconds.
        link: a network namespace to run in (the URLs must then name its outside address).
        connection_class: the pools' ``connection_class`` as ``module:name`` (None:
            ``psycopg.Connection``).
    """

    def __init__(
        self,
        name: str,
        *,
        db: str,
        budget: dict[str, Any] | None,
        options: dict[str, Any],
        tag: str,
        workers: int = 4,
        statement: str = "SELECT pg_sleep(0.002)",
        timeout: float = 20.0,
        link: Link | None = None,
        connection_class: str | None = None,
    ) -> None:
        self.name = name
        self.folder = Path(tempfile.mkdtemp(prefix=f"orbit-host-{name}-"))
        self.folder.chmod(0o755)
        self.workers = workers
        self.mode("idle")
        self.config = {
            "folder": str(self.folder),
            "fleet": "budget-host" if ISOLATED else f"budget-{name}-{os.getpid()}",
            "db": db,
            "budget": budget,
            "options": options,
            "tag": tag,
            "workers": workers,
            "statement": statement,
            "timeout": timeout,
            "connection_class": connection_class,
        }
        command = [sys.executable, "-m", "tests.clients._budget_host", json.dumps(self.config)]
        if ISOLATED:
            command = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _PRIVATE_SHM,
                       "sh", *command]  # fmt: skip
        if link is not None:
            command = ["ip", "netns", "exec", link.name, *command]
        with (self.folder / "stderr").open("wb") as stderr:
            self.process = subprocess.Popen(
                command, cwd=ROOT, start_new_session=True, stderr=stderr
            )

    def mode(self, mode: str) -> None:
        """Set what the workers do: ``busy``, ``idle`` or ``stop``."""
        temporary = self.folder / "mode.tmp"
        temporary.write_text(mode)
        temporary.replace(self.folder / "mode")

    def stats(self) -> list[dict[str, Any]]:
        """What each worker wrote last (a worker that wrote nothing yet is left out)."""
        found = []
        for index in range(self.workers):
            with contextlib.suppress(FileNotFoundError, ValueError):
                found.append(json.loads((self.folder / f"stats-{index}.json").read_text()))
        return found

    def census(self) -> dict[str, Any]:
        """The host-wide numbers of the freshest worker report (``pool.statistics()``)."""
        reports = [report for report in self.stats() if report.get("stats")]
        if not reports:
            return {}
        return dict(max(reports, key=lambda report: report["at"])["stats"])

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until every worker has built its pool.

        Raises:
            AssertionError: one refused to (its error), or the host died, or the time ran out.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reports = self.stats()
            refused = [report["refused"] for report in reports if "refused" in report]
            assert not refused, f"host {self.name}: {refused[0]}"
            if len(reports) == self.workers:
                return
            assert self.process.poll() is None, f"host {self.name} died: {self.stderr()}"
            time.sleep(0.05)
        raise AssertionError(f"host {self.name} not ready in {timeout} s: {self.stderr()}")

    def errors(self) -> dict[str, int]:
        """Every failed request of the host, by error type."""
        total: dict[str, int] = {}
        for report in self.stats():
            for name, count in report.get("errors", {}).items():
                total[name] = total.get(name, 0) + count
        return total

    def successes(self) -> int:
        return sum(int(report.get("ok", 0)) for report in self.stats())

    def first_success_at(self) -> float | None:
        """The earliest first success of a worker since it turned busy (monotonic s)."""
        found = [r["first_ok_at"] for r in self.stats() if r.get("first_ok_at") is not None]
        return min(found) if found else None

    def stderr(self) -> str:
        with contextlib.suppress(OSError):
            return (self.folder / "stderr").read_text(errors="replace")[-3000:]
        return ""

    def kill(self) -> None:
        """SIGKILL every process of the host at once."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """Tell the workers to stop (they close their pools), wait, then kill what is left."""
        self.mode("stop")
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        shutil.rmtree(self.folder, ignore_errors=True)
