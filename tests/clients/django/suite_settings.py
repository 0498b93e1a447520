"""Settings for Django's own test suite (its ``runtests.py``) against a test's server.

The environment chooses the engine (``ORBIT_SUITE_ENGINE``), the server's port,
the database names' prefix (so runs can share a server at once) and, for the
engine, the fleet. ``suite_runner.RecordingRunner`` writes each test's outcome
to ``ORBIT_SUITE_RESULTS``. Mirrors the suite's own ``test_sqlite.py``.
"""

from __future__ import annotations

import os
from typing import Any

_ENGINE = os.environ["ORBIT_SUITE_ENGINE"]
_PREFIX = os.environ["ORBIT_SUITE_PREFIX"]


def _database(name: str) -> dict[str, Any]:
    database: dict[str, Any] = {
        "ENGINE": _ENGINE,
        "NAME": f"{_PREFIX}_{name}",
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": int(os.environ["ORBIT_SUITE_PORT"]),
    }
    if _ENGINE == "orbitive.clients.django":
        pool = {"fleet": os.environ["ORBIT_SUITE_FLEET"], "max_live": 10, "timeout": 10.0}
        database["OPTIONS"] = {"pool": pool}
    return database


DATABASES = {"default": _database("default"), "other": _database("other")}
SECRET_KEY = "django_tests_secret_key"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DEFAULT_AUTO_FIELD = "django.db.models.AutoField"
USE_TZ = False
TEST_RUNNER = "tests.clients.django.suite_runner.RecordingRunner"
