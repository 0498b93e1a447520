"""Store URLs and :func:`open_store`.

Forms::

    None                          SQLite file in the user's state directory (default)
    sqlite:///abs/path/locks.db   SQLite file at an absolute path
    sqlite:relative/locks.db      SQLite file relative to the working directory
    postgresql://user@host/db     PostgreSQL (also postgres://); any libpq URI
    shm://FLEET?capacity=N        the store's SHM lock table of fleet FLEET (capacity: the
                                  fleet's own when it exists, else 64)
    redis://[user:pw@]host[:port][/db]   one Redis node (also rediss:// for TLS)
    unix:///path/redis.sock[?db=N]       one Redis node over a Unix socket

PostgreSQL and Redis URLs take ``?timeout=S``: every call returns or raises
``StoreError(UNAVAILABLE)`` within S seconds (default 5). Redis URLs also take
``?prefix=P``, the prefix of every key the store writes (default ``orbitive:``).

The default file is ``$XDG_STATE_HOME/orbitive/locks.db`` (``~/.local/state`` when
the variable is unset or relative); its directory is created 0700 and the file 0600,
and either is refused (``AccessDenied``) when it is a symlink, another user's, or
open to group or others.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
from functools import partial
from pathlib import Path
from typing import Any, Final, cast
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit, urlunsplit

from .._core._access import check_dir
from .._core._errors import InvalidStoreUrl
from .._core._fleet import CAPACITY_MAX
from ._backend import AsyncForm
from ._engine import Engine
from ._engine_async import AsyncEngine
from ._network import split_param, split_timeout
from ._store import Store

_SCHEME: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
#: The password of a ``scheme://user:password@`` URL, for messages about unparsable URLs.
_PASSWORD: Final = re.compile(r"(://[^:/@]*:)[^@/]*@")
_REDIS_SCHEMES: Final = ("redis", "rediss", "unix")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def default_path() -> Path:
    """``$XDG_STATE_HOME/orbitive/locks.db`` or ``~/.local/state/orbitive/locks.db``."""
    base = os.environ.get("XDG_STATE_HOME", "")
    root = Path(base) if base.startswith("/") else Path.home() / ".local" / "state"
    return root / "orbitive" / "locks.db"


def open_store(url: str | None = None) -> Store:
    """Open a named-lock store.

    Args:
        url: ``None`` for the embedded default (a SQLite file in the user's state
            directory), ``sqlite:///abs/path.db``, ``sqlite:relative.db``,
            ``postgresql://...`` (or ``postgres://...``), ``shm://FLEET`` with an
            optional ``?capacity=N`` (default: the capacity of the existing fleet,
            else 64), or ``redis://host[:port][/db]`` (also ``rediss://``,
            ``unix:///path.sock``). PostgreSQL and Redis URLs take ``?timeout=S``,
            the bound in seconds on every call (default 5); Redis URLs take
            ``?prefix=P`` (default ``orbitive:``).

    Returns:
        An open :class:`Store`; close it, or use it as a context manager.

    Raises:
        InvalidStoreUrl: not a str or None, an unknown scheme, a malformed URL
            (one urllib or libpq cannot split, a host name no resolver takes, a
            redis-py argument it refuses), a NUL, a lone surrogate in a network
            URL or a SQLite path, a Redis ``?prefix=`` that is not UTF-8 once
            percent-decoded (also ``ValueError``), or a ``sqlite:`` path to a file
            that is not a SQLite database.
        CapacityMismatch: an ``shm://`` fleet has another capacity than
            ``?capacity=N`` asks for (an ``InvalidCapacity``, also ``ValueError``).
        StoreError: ``UNAVAILABLE`` when the database cannot be opened or reached,
            ``psycopg`` (``redis``) is not installed for a PostgreSQL (Redis) URL, or
            every node of an ``shm://`` fleet is held.
        AccessDenied: the default file or its directory is a symlink, another
            user's, or open to group or others.
        LayoutMismatch: ``shm://`` fleet objects exist but are not the store's table.

    Example::

        with open_store("sqlite:///var/tmp/locks.db") as store:
            lock = store.try_lock("jobs/nightly", owner="worker-1", ttl=30.0)
            if lock is not None:
                with lock:
                    run_job(lock.fencing_token)

    Store contract: one contract, the same on a SQLite file, the SHM table, PostgreSQL and Redis.
    """
    engine, shown, async_form = _engine_for(url)
    return Store(engine, shown, async_form)


#: What a URL opens: the engine, the URL as shown (password removed), the asyncio form.
_Opened = tuple[Engine[Any, Any], str, AsyncForm]


def _engine_for(url: object) -> _Opened:
    if url is None:
        from ._sqlite import SqliteEngine  # noqa: PLC0415 - engines load on demand

        path = default_path()
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        check_dir(path.parent)
        engine = SqliteEngine(path, private=True)
        return engine, f"sqlite://{path}", partial(AsyncEngine, engine)
    if not issubclass(type(url), str):  # type(), not isinstance: __class__ may lie
        raise InvalidStoreUrl(f"store URL must be a str or None, not {type(url).__name__}")
    url = str.__str__(cast(str, url))  # an exact str: a subclass's methods are not called
    if "\x00" in url:
        raise InvalidStoreUrl("store URL has a NUL character")
    match = _SCHEME.match(url)
    scheme = match.group(1).lower() if match else ""
    if scheme == "sqlite":
        return _sqlite(url)
    if not _is_utf8(url):  # a path may carry any byte (above); a network name may not
        raise InvalidStoreUrl(f"store URL {url!r} has no UTF-8 form (a lone surrogate)")
    if scheme in ("postgresql", "postgres"):
        return _postgres(url)
    if scheme == "shm":
        return _shm(url)
    if scheme in _REDIS_SCHEMES:
        return _redis(url)
    raise InvalidStoreUrl(
        f"unknown store URL {url!r}: expected sqlite:///path, sqlite:path, "
        "postgresql://..., postgres://..., shm://FLEET, redis://..., rediss://... or unix://..."
    )


def _sqlite(url: str) -> _Opened:
    from ._sqlite import SqliteEngine  # noqa: PLC0415 - engines load on demand

    rest = url[len("sqlite:") :]
    if rest.startswith("//"):
        rest = rest[2:]
        if not rest.startswith("/"):
            raise InvalidStoreUrl(
                f"store URL {url!r}: use sqlite:///absolute/path or sqlite:relative/path"
            )
    if not rest or "?" in rest or "#" in rest:
        raise InvalidStoreUrl(f"store URL {url!r} has no usable file path")
    try:
        os.fsencode(rest)  # a lone surrogate the file system encoding cannot carry
    except UnicodeEncodeError:
        raise InvalidStoreUrl(
            f"store URL {url!r}: the path has no file system form (a lone surrogate)"
        ) from None
    engine = SqliteEngine(Path(rest), private=False)
    return engine, url, partial(AsyncEngine, engine)


def _postgres(url: str) -> _Opened:
    from ._postgres import PostgresEngine  # noqa: PLC0415 - psycopg loads on demand
    from ._postgres_async import PostgresAsyncEngine  # noqa: PLC0415

    conninfo, timeout = postgres_conninfo(url)
    engine = PostgresEngine(conninfo, timeout=timeout)
    return engine, _redacted(url), partial(PostgresAsyncEngine, engine)


def postgres_conninfo(url: str) -> tuple[str, float]:
    """The libpq URI of a ``postgresql://`` (or ``postgres://``) URL without its
    ``?timeout=``, and that bound in seconds (default 5), checked as :func:`open_store`
    checks it, without connecting.

    Raises:
        InvalidStoreUrl: a NUL or a lone surrogate, a ``timeout`` out of range, or a URL
            libpq refuses (an unknown query parameter, an unclosed bracket, a host name
            no resolver takes); the message shows no password.
    """
    if "\x00" in url:
        raise InvalidStoreUrl("store URL has a NUL character")
    if not _is_utf8(url):
        raise InvalidStoreUrl(f"store URL {_redacted(url)!r} has no UTF-8 form (a lone surrogate)")
    conninfo, timeout = split_timeout(url)
    problem = _libpq_refuses(conninfo)
    if problem:  # an unclosed IPv6 bracket is a bad URL, not an unreachable server
        shown = _PASSWORD.sub(r"\1***@", url)
        raise InvalidStoreUrl(f"store URL {shown!r} is malformed: {problem}")
    return conninfo, timeout


def _libpq_refuses(url: str) -> str:
    """libpq's own reason not to parse ``url``, or a host no resolver takes ('' when it
    parses, or psycopg is missing)."""
    try:
        from psycopg import ProgrammingError  # noqa: PLC0415 - psycopg loads on demand
        from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415
    except ImportError:
        return ""  # PostgresEngine says psycopg is missing
    try:
        params = conninfo_to_dict(url)
    except ProgrammingError as error:  # its message quotes the URL, password and all: cut it
        return str(error).strip().splitlines()[0].split(" in URI")[0] or "libpq refuses it"
    hosts = str(params.get("host") or "").split(",")
    return next(filter(None, map(_host_refused, hosts)), "")


def _host_refused(host: str) -> str:
    """Why a resolver refuses the host name ``host`` before any lookup ('' when it takes
    it: an IP address, a socket folder, or a name of valid IDNA labels)."""
    if not host or host.startswith("/"):
        return ""
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return ""
    try:
        host.encode("idna")  # what socket.getaddrinfo does to a str host
    except UnicodeError as error:
        return f"host {host!r} is not a host name ({error.__cause__ or error})"
    return ""


def _split(url: str, shown: str) -> SplitResult:
    """``urlsplit(url)``; ``shown`` is the URL as messages may show it.

    Raises:
        InvalidStoreUrl: urllib refuses it (an unbalanced "["), or its bracketed host
            is no IPv6 address (checked here: urllib checks it only from Python
            3.11.4 on, and would hand ``zz`` of ``redis://[zz]`` to a resolver).
    """
    try:
        parts = urlsplit(url)
    except ValueError as error:
        raise InvalidStoreUrl(f"store URL {shown!r}: {error}") from None
    host = parts.netloc.rpartition("@")[2]
    if "[" in host:
        bracketed = host.partition("[")[2].partition("]")[0]
        with contextlib.suppress(ValueError):
            ipaddress.IPv6Address(bracketed)
            return parts
        raise InvalidStoreUrl(
            f"store URL {shown!r}: its bracketed host {bracketed!r} is no IPv6 address"
        )
    return parts


def _shm(url: str) -> _Opened:
    from ._shm import ShmEngine  # noqa: PLC0415 - orbitive.lock loads on demand
    from ._shm_async import ShmAsyncEngine  # noqa: PLC0415

    parts = _split(url, url)
    query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=False)
    unknown = set(query) - {"capacity"}
    if parts.path not in ("", "/") or unknown or parts.fragment or not parts.netloc:
        raise InvalidStoreUrl(f"store URL {url!r}: expected shm://FLEET[?capacity=N]")
    capacity = None  # the fleet's own capacity, or the default for a new fleet
    if "capacity" in query:
        value = query["capacity"][-1]
        if not value.isdecimal() or not 1 <= int(value) <= CAPACITY_MAX:
            raise InvalidStoreUrl(
                f"store URL {url!r}: capacity must be a whole number in 1..{CAPACITY_MAX}"
            )
        capacity = int(value)
    engine = ShmEngine(parts.netloc, capacity)
    return engine, url, partial(ShmAsyncEngine, engine)


def _is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _redis(url: str) -> _Opened:
    from ._redis import RedisEngine  # noqa: PLC0415 - redis loads on demand

    rest, timeout = split_timeout(url)
    rest, prefix = split_param(rest, "prefix")
    parts = _split(rest, _redacted(url))
    where = parts.path if parts.scheme.lower() == "unix" else parts.hostname
    if not where or parts.fragment:
        raise InvalidStoreUrl(
            f"store URL {_redacted(url)!r}: expected redis://host[:port][/db], rediss://... "
            "or unix:///path/to/redis.sock"
        )
    if parts.scheme.lower() != "unix" and (problem := _host_refused(where)):
        raise InvalidStoreUrl(f"store URL {_redacted(url)!r}: {problem}")
    engine = RedisEngine(rest, timeout=timeout, prefix=_prefix(prefix))
    return engine, _redacted(url), partial(AsyncEngine, engine)


def _prefix(raw: str | None) -> str:
    """The ``?prefix=`` value, percent-decoded (:data:`PREFIX_DEFAULT` when absent).

    Raises:
        InvalidStoreUrl: empty, a control character, or no UTF-8 text once decoded.
    """
    from ._redis import PREFIX_DEFAULT  # noqa: PLC0415 - redis loads on demand

    if raw is None:
        return PREFIX_DEFAULT
    try:
        prefix = unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise InvalidStoreUrl("store URL parameter prefix is not UTF-8 once decoded") from None
    if not prefix or _CONTROL.search(prefix):
        raise InvalidStoreUrl("store URL parameter prefix must be non-empty, no control characters")
    return prefix


def _redacted(url: str) -> str:
    """The URL with any password replaced by ``***`` (for reprs and messages)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # libpq read a URL urllib cannot split: show no part of it
        return url[: url.index(":") + 1] + "//***"
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def open_engine(url: str) -> Engine[Any, Any]:
    """The engine a store URL opens, without a :class:`Store` around it: for a caller
    that speaks the engine's primitives itself (the client pool's budget renews and
    releases batches of one owner's counting leases).

    Raises:
        As :func:`open_store`.
    """
    return _engine_for(url)[0]
