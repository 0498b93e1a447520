"""The mix site's settings: the orbitive engine, its pool from ``MIX_*`` variables."""

from __future__ import annotations

import os
from typing import Any

SECRET_KEY = "not-a-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1"]
INSTALLED_APPS = ["tests.clients.django.mix_site"]
ROOT_URLCONF = "tests.clients.django.mix_site.urls"
USE_TZ = True
DATABASES: dict[str, dict[str, Any]] = {
    "default": {
        "ENGINE": "orbitive.clients.django",
        "NAME": os.environ["MIX_DB_NAME"],
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": os.environ["MIX_DB_PORT"],
        "CONN_MAX_AGE": 0,
        "OPTIONS": {
            "pool": {
                "fleet": os.environ["MIX_FLEET"],
                "max_live": int(os.environ["MIX_MAX_LIVE"]),
                "mode": os.environ["MIX_MODE"],
            },
        },
    },
}
