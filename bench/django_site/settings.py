"""Settings of the benchmark's site; the database entry comes from the environment."""

from __future__ import annotations

import json
import os

SECRET_KEY = "bench-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = ["bench.django_site"]
ROOT_URLCONF = "bench.django_site.urls"
MIDDLEWARE: list[str] = []
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
DATABASES = {"default": json.loads(os.environ["BENCH_DJANGO_DATABASE"])}
