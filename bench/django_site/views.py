"""The benchmark's one view: two ORM queries, as a page that shows an item and the next ones."""

from __future__ import annotations

import os

from django.http import HttpRequest, JsonResponse

from .models import Item


def item(request: HttpRequest, pk: int) -> JsonResponse:
    """The item ``pk`` and the names of the three after it (two queries), and the worker."""
    found = Item.objects.get(pk=pk)
    after = Item.objects.filter(pk__gt=pk).order_by("pk").values_list("name", flat=True)[:3]
    page = {"name": found.name, "stock": found.stock, "next": list(after)}
    return JsonResponse({**page, "worker": os.getpid()})
