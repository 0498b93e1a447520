"""What flask-limiter and slowapi make of the shm:// storages, as docs/recipes.md says:
both take ``shm://``; both refuse ``async+shm://`` when the limiter is built, since they
call the synchronous strategies of ``limits`` (in slowapi's ``async def`` routes too)."""

from __future__ import annotations

from collections.abc import Callable

import flask
import flask_limiter
import flask_limiter.util
import pytest
import slowapi
import slowapi.util


def _flask_limiter(url: str) -> object:
    app = flask.Flask(__name__)
    return flask_limiter.Limiter(flask_limiter.util.get_remote_address, app=app, storage_uri=url)


def _slowapi(url: str) -> object:
    return slowapi.Limiter(key_func=slowapi.util.get_remote_address, storage_uri=url)


@pytest.mark.parametrize("build", [_flask_limiter, _slowapi])
def test_the_frameworks_take_shm_and_refuse_its_async_form(
    build: Callable[[str], object], fleet: str
) -> None:
    build(f"shm://{fleet}")
    with pytest.raises(AssertionError):  # limits.strategies: the storage is no sync Storage
        build(f"async+shm://{fleet}")
