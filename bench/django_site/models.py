"""The benchmark's table: items read by primary key and in key order."""

from __future__ import annotations

from django.db import models


class Item(models.Model):
    """A catalogue item (the table ``django_site_item``, filled by the benchmark)."""

    name: models.CharField[str, str] = models.CharField(max_length=40)
    stock: models.IntegerField[int, int] = models.IntegerField()
