"""gunicorn settings for the real-gunicorn test: 4 sync workers, the fleet joined per worker."""

from __future__ import annotations

import os
from typing import Any

bind = os.environ["ORBIT_TEST_BIND"]
workers = 4
worker_class = "sync"
timeout = 60
graceful_timeout = 10
loglevel = "warning"


def post_fork(server: Any, worker: Any) -> None:
    """Each worker is its own process life: join the fleet here, not in the master."""
    from tests.clients import _wsgi_app  # noqa: PLC0415 - imported in the worker only

    _wsgi_app.start()


def worker_exit(server: Any, worker: Any) -> None:
    """Return the worker's connections before it goes."""
    from tests.clients import _wsgi_app  # noqa: PLC0415 - as above

    _wsgi_app.stop()
