"""The mix site's URLs."""

from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("read", views.read),
    path("write/<str:rid>", views.write),
    path("savepoint/<str:rid>", views.savepoint),
    path("iterate/<str:inside>", views.iterate),
]
