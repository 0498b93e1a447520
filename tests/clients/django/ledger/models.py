"""The engine tests' one model: accounts whose balances transactions move."""

from __future__ import annotations

from django.db import models


class Account(models.Model):
    """A named balance, locked with ``select_for_update()`` while it changes."""

    name: models.CharField[str, str] = models.CharField(max_length=20, unique=True)
    balance: models.IntegerField[int, int] = models.IntegerField(default=0)

    class Meta:
        app_label = "ledger"
