"""Network faults under the ``postgresql://`` storage, through the store's fault-injecting
proxy (``tests/store/_faultproxy.py``): a silent network bounds every call by the URL's
``?timeout=``, and a reply lost after the commit is retried on a fresh connection,
counting the hit again (more refusals, never an admission more)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from orbitive.store import ErrorKind, StoreError

from .._servers import TempPostgres
from ..store._faultproxy import FaultProxy
from ._pg import form, open_form, pg_url

__all__ = ["form", "pg_url"]  # fixtures

#: The calls' bound in the black-hole test, in seconds.
BOUND_S = 0.5
#: libpq's smallest connect timeout (a call that must reconnect may take it on top), and
#: scheduling on a loaded machine.
SLACK_S = 2.0 + 1.5


@pytest.fixture
def proxy(postgres_server: TempPostgres) -> Iterator[FaultProxy]:
    """A fault proxy in front of the session's server."""
    with FaultProxy(postgres_server.port) as started:
        yield started


@pytest.fixture
def proxied_url(pg_url: str, proxy: FaultProxy, postgres_server: TempPostgres) -> str:
    """``pg_url`` (a fresh schema) through the proxy, with a call bound of BOUND_S."""
    return pg_url.replace(f":{postgres_server.port}/", f":{proxy.port}/") + f"&timeout={BOUND_S}"


CALLS: list[Callable[[Any], object]] = [
    lambda s: s.incr("k", 60),
    lambda s: s.get("k"),
    lambda s: s.acquire_entry("m", 5, 60),
    lambda s: s.get_moving_window("m", 5, 60),
    lambda s: s.acquire_sliding_window_entry("s", 5, 60),
    lambda s: s.get_sliding_window("s", 60),
    lambda s: s.reset(),
]


@pytest.mark.slow  # seven calls of up to 2.5 s each
def test_every_call_into_a_black_hole_ends_unavailable_within_the_timeout(
    form: str, proxied_url: str, proxy: FaultProxy
) -> None:
    storage = open_form(form, proxied_url)
    try:
        assert storage.incr("k", 60) == 1  # connected, the tables made
        proxy.black_hole()
        for call in CALLS:
            started = time.monotonic()
            with pytest.raises(StoreError) as caught:
                call(storage)
            elapsed = time.monotonic() - started
            assert caught.value.kind is ErrorKind.UNAVAILABLE, caught.value
            assert elapsed < BOUND_S + SLACK_S, f"{elapsed:.2f} s for a {BOUND_S} s bound"
        assert storage.check() is False
        proxy.heal()
        assert storage.incr("k", 60) == 2  # a fresh connection; nothing black-holed counted
    finally:
        storage.close()


def test_a_hit_whose_reply_was_lost_counts_again_and_is_never_admitted_twice(
    form: str, proxied_url: str, proxy: FaultProxy
) -> None:
    storage = open_form(form, proxied_url.replace(f"timeout={BOUND_S}", "timeout=5"))
    try:
        assert storage.incr("k", 60) == 1
        proxy.lose_next_reply()
        assert storage.incr("k", 60) == 3  # the first try committed 2; the retry counted 3
        assert proxy.fired == 1
        assert storage.acquire_entry("m", 2, 60)
        proxy.lose_next_reply()
        assert storage.acquire_entry("m", 2, 60) is False  # its first try took the last place
        assert storage.get_moving_window("m", 2, 60)[1] == 2
    finally:
        storage.close()
