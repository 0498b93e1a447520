"""Store URL forms (``open_store``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orbitive._core._errors import InvalidStoreUrl
from orbitive.store import ErrorKind, StoreError, _url, open_store


def test_sqlite_absolute_and_relative_forms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_store(f"sqlite://{tmp_path}/abs.db") as store:
        assert store.url == f"sqlite://{tmp_path}/abs.db"
    assert (tmp_path / "abs.db").exists()
    monkeypatch.chdir(tmp_path)
    with open_store("sqlite:rel.db"):
        pass
    assert (tmp_path / "rel.db").exists()


@pytest.mark.parametrize(
    "url",
    [
        "",
        "locks.db",
        "mysql://host/db",
        "sqlite:",
        "sqlite://host/path.db",
        "sqlite:///x.db?mode=ro",
        "shm://",
        "shm://bad name",
        "shm://fleet/path",
        "shm://fleet?capacity=many",
        "shm://fleet?size=3",
        # what urllib, idna or redis-py refused later with ValueError, UnicodeError or
        # TypeError (or refused with a misleading "unavailable"):
        "redis://[::1",
        "rediss://[",
        "redis://[zz]:1/0",
        "redis://\ud800/0",
        "redis://" + "a" * 64 + "/0",
        "redis://a..b/0",
        "postgresql://" + "a" * 64 + "/db",
        "postgresql://h1,a..b/db",
        "redis://127.0.0.1:1/0?ssl_cert_reqs=none",
        "unix:///tmp/\x00x.sock",
        "redis://127.0.0.1:1/0?prefix=%ff",
        "redis://127.0.0.1:1/0?prefix=\ud800",
    ],
    ids=ascii,
)
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(InvalidStoreUrl) as caught:
        open_store(url)
    assert caught.value.kind is ErrorKind.INVALID_INPUT
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, StoreError)


def test_non_string_url_is_refused() -> None:
    with pytest.raises(InvalidStoreUrl):
        open_store(42)  # type: ignore[arg-type]


def test_default_path_follows_xdg_state_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", "/srv/state")
    assert _url.default_path() == Path("/srv/state/orbitive/locks.db")
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")
    assert _url.default_path() == Path.home() / ".local/state/orbitive/locks.db"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert _url.default_path() == Path(os.path.expanduser("~/.local/state/orbitive/locks.db"))


def test_passwords_are_redacted() -> None:
    assert _url._redacted("postgresql://u:secret@h:5/db") == "postgresql://u:***@h:5/db"
    assert _url._redacted("postgres://u@h/db") == "postgres://u@h/db"


def test_shm_capacity_query(shm_url: str) -> None:
    with open_store(shm_url) as store:
        assert store.url == shm_url
        assert store.try_lock("x", "w1", 1.0) is not None


#: The pieces of the probe's URLs: odd and ordinary, none that needs a DNS lookup or
#: makes an SHM object (each network URL ends at a closed loopback port or is refused).
SCHEMES = ["redis", "rediss", "unix", "postgresql", "postgres", "sqlite", "\udcff", "redis\x00"]
HOSTS = [
    "127.0.0.1",
    "[::1]",
    "[",
    "[zz]",
    "\udcff",
    "a..b",
    "a" * 64,
    "",
    "%00",
    "u:\udcff@127.0.0.1",
]
PORTS = ["", ":1", ":99999", ":x", ":-1", ":" + "9" * 30]
PATHS = ["", "/0", "/\udcff", "/" + "9" * 30, "/\x00"]
QUERIES = [
    "", "?prefix=%ff", "?prefix=\udcff", "?prefix=", "?prefix=a%00", "?timeout=\udcff",
    "?timeout=1e400", "?ssl_cert_reqs=none", "?protocol=9", "?db=x", "#frag",
]  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    scheme=st.sampled_from(SCHEMES),
    host=st.sampled_from(HOSTS),
    port=st.sampled_from(PORTS),
    path=st.sampled_from(PATHS),
    query=st.sampled_from(QUERIES),
)
def test_odd_urls_open_or_raise_a_named_error(
    scheme: str, host: str, port: str, path: str, query: str
) -> None:
    joiner = "&" if "?" in query else "?"
    url = f"{scheme}://{host}{port}{path}{query}{joiner}timeout=0.05"
    try:
        store = open_store(url)
    except StoreError as error:
        assert error.kind in (ErrorKind.INVALID_INPUT, ErrorKind.UNAVAILABLE), error
    else:
        store.close()
