"""The per-run workspace: a temporary directory, unique names, and lazily started servers.

Contenders are built in the runner process and opened again in forked children:
:class:`Prepared` is what a contender leaves in the parent (``open`` builds a
:class:`Session` in whichever process calls it; ``cleanup`` runs once, in the
parent). A server is started the first time a contender asks for it and stopped
when the workspace closes; a server that failed to start is not retried.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from tests._servers import ServerUnavailable, TempPostgres, TempRedis, TempServer

from ._measure import Skip


class Session(NamedTuple):
    """An open contender in one process: ``cycle(key_index)`` is one acquire + release."""

    cycle: Callable[[int], bool]
    close: Callable[[], None]


class Prepared(NamedTuple):
    """A contender set up for ``keys`` keys; ``open`` runs in each measuring process."""

    open: Callable[[], Session]
    cleanup: Callable[[], None]


class Workspace:
    """Everything one benchmark run creates, removed by :meth:`close`."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="orbit-bench-"))
        self.tag = f"{os.getpid()}"
        self._counter = 0
        self._servers: dict[str, TempServer | Skip] = {}

    def unique(self, prefix: str) -> str:
        """A name unique to this run (fleet names, semaphore names, files)."""
        self._counter += 1
        return f"{prefix}-{self.tag}-{self._counter}"

    def postgres(self) -> TempPostgres:
        """The run's PostgreSQL server, started on first use; raises Skip with the reason."""
        found = self._server("postgres", TempPostgres.start)
        assert isinstance(found, TempPostgres)
        return found

    def redis(self) -> TempRedis:
        """The run's redis-server, started on first use; raises Skip with the reason."""
        found = self._server("redis", TempRedis.start)
        assert isinstance(found, TempRedis)
        return found

    def _server(self, name: str, start: Callable[[], TempServer]) -> TempServer:
        if name not in self._servers:
            try:
                self._servers[name] = start()
            except ServerUnavailable as exc:
                self._servers[name] = Skip(str(exc))
        found = self._servers[name]
        if isinstance(found, Skip):
            raise Skip(str(found))
        return found

    def close(self) -> None:
        """Stop the servers and remove the directory."""
        for server in self._servers.values():
            if isinstance(server, TempServer):
                with contextlib.suppress(OSError):
                    server.stop()
        self._servers.clear()
        shutil.rmtree(self.root, ignore_errors=True)
