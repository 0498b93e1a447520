"""The mix site's views: each answers JSON, or fails the request with a 500."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, JsonResponse

from .models import Entry, Tally


class _RolledBack(Exception):
    """Leaves the inner ``atomic()`` block of :func:`savepoint`: its savepoint rolls back."""


def read(request: HttpRequest) -> JsonResponse:
    """Two plain reads in autocommit."""
    latest = list(Entry.objects.order_by("-id").values_list("request", flat=True)[:3])
    return JsonResponse({"tally": Tally.objects.get(name="writes").value, "latest": latest})


def write(request: HttpRequest, rid: str) -> JsonResponse:
    """In one transaction: lock the tally row, raise it, and record the request."""
    with transaction.atomic():
        tally = Tally.objects.select_for_update().get(name="writes")
        tally.value += 1
        tally.save(update_fields=["value"])
        Entry.objects.create(request=rid)
    return JsonResponse({"tally": tally.value})


def savepoint(request: HttpRequest, rid: str) -> JsonResponse:
    """Record the request; in a savepoint record another row, then roll it back."""
    with transaction.atomic():
        Entry.objects.create(request=rid)
        try:
            with transaction.atomic():
                Entry.objects.create(request=f"{rid}-rolled-back")
                raise _RolledBack
        except _RolledBack:
            pass
    return JsonResponse({"kept": rid})


def iterate(request: HttpRequest, inside: str) -> JsonResponse:
    """Count the entries through ``.iterator()`` (a server-side cursor), in ``atomic()``
    when ``inside`` is "1" (a plain cursor), else outside it (``WITH HOLD``)."""
    entries = Entry.objects.order_by("id").values_list("id", flat=True)
    if inside == "1":
        with transaction.atomic():
            count = sum(1 for _ in entries.iterator(chunk_size=50))
    else:
        count = sum(1 for _ in entries.iterator(chunk_size=50))
    return JsonResponse({"count": count})
