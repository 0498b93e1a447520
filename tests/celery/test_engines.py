"""orbitive.celery.Singleton on every store engine (an eager app; the worker's side on
SHM and PostgreSQL is ``test_worker.py``)."""

from __future__ import annotations

from typing import Any

from orbitive.celery import Singleton
from orbitive.store import open_store

from .conftest import MakeApp


def test_a_held_key_refuses_skips_and_each_run_gets_a_larger_token(
    make_app: MakeApp, engine_url: str
) -> None:
    app = make_app(orbitive_store_url=engine_url)
    tokens: list[int | None] = []

    @app.task(base=Singleton, bind=True, name="engines.once", unique_on=["key"])
    def once(self: Singleton, key: str, note: Any = None) -> None:
        tokens.append(self.lock_token)

    @app.task(base=Singleton, bind=True, name="engines.skip", lock_mode="skip")
    def skip(self: Singleton, key: str) -> None:
        tokens.append(self.lock_token)

    once.delay("a", note=1)
    once.delay(key="a", note=2)
    with open_store(engine_url) as store:
        with store.lock(once.lock_name(("a",), {}), "held-1 host:1:ab", ttl=10.0):
            assert once.delay("a").id == "held-1"
            skip_name = skip.lock_name(("a",), {})
            with store.lock(skip_name, "held-2 host:1:ab", ttl=10.0):
                assert skip.delay("a").get() is None
        assert store.locks() == []
    assert len(tokens) == 2
    first, second = tokens
    assert first is not None and second is not None and second > first
