"""The mix site's tables (made by the test with SQL, not by migrations)."""

from __future__ import annotations

from django.db import models


class Entry(models.Model):
    """One row per committed write; ``request`` names the request that wrote it."""

    request: models.CharField[str, str] = models.CharField(max_length=40, unique=True)

    class Meta:
        app_label = "mix_site"
        db_table = "mix_entry"


class Tally(models.Model):
    """A counter the writes raise by one each, under a row lock."""

    name: models.CharField[str, str] = models.CharField(max_length=20, unique=True)
    value: models.IntegerField[int, int] = models.IntegerField(default=0)

    class Meta:
        app_label = "mix_site"
        db_table = "mix_tally"
