"""The database a PostgreSQL connection goes to, and the pool key of its budget.

One database is one budget, whichever API opens it: a sync SQLAlchemy engine,
an asyncio one (on asyncpg or psycopg) and an asyncpg pool that connect to the
same server, database and role share one key, so a fleet that mixes gunicorn
and uvicorn workers holds one ``max_live``, not one per API. The key is the
digest of the connection's *target*, as the server counts connections:

* the server (``host``, ``port``; a pg_service.conf ``service`` name when one is
  given), the database and the role (``user``);
* a part that is missing takes libpq's default, as both drivers do: the
  ``PGHOST``, ``PGPORT``, ``PGDATABASE`` and ``PGUSER`` environment variables,
  else the default socket, 5432, the user's name and the role's name;
* nothing else: the password, the driver and client-side options (statement
  caches, row factories, timeouts, ``application_name``, ``server_settings``)
  change neither the server's count nor its limit, so they never split the
  budget.

A spelling the server treats alike but the text does not (``localhost`` and
``127.0.0.1``) gives two keys: spell the target one way, or give every pool the
same ``key``. Which clients one pool may reuse is the adapter's own rule (each
takes only connections it made itself), so the key does not need to encode it.
"""

from __future__ import annotations

import getpass
import os
import urllib.parse
from collections.abc import Mapping
from typing import Final, cast

from .._core._errors import InvalidPoolOptions, shown
from ..pool import Key
from ._options import printable_label

#: The URL schemes of a PostgreSQL DSN.
SCHEMES: Final = ("postgresql", "postgres")
#: libpq's default port.
DEFAULT_PORT: Final = "5432"


def database_key(
    *,
    host: object = None,
    port: object = None,
    database: object = None,
    user: object = None,
    service: object = None,
) -> Key:
    """The pool key of a PostgreSQL target (see the module for the rule).

    Args:
        host: a host name, address or socket directory (str), several
            (a list, or a comma-separated str), or None for the default.
        port: an int or str, several (a list), or None for the default.
        database: the database name (str) or None for the default.
        user: the role (str) or None for the default.
        service: a pg_service.conf service name (str) or None.

    Returns:
        The :class:`~orbitive.pool.Key` of the target.

    Raises:
        InvalidPoolOptions: a part that is not a str, an int or a list of them,
            or text with a NUL or without a UTF-8 form.
    """
    user_text = _part("user", user) or os.environ.get("PGUSER") or _login()
    parts = (
        _part("service", service),
        _part("host", host) or os.environ.get("PGHOST", ""),
        _part("port", port) or os.environ.get("PGPORT") or DEFAULT_PORT,
        _part("database", database) or os.environ.get("PGDATABASE") or user_text,
        user_text,
    )
    return Key.digest("\0".join(("postgresql", *parts)).encode())


#: libpq's environment variable for each target part a connection may leave out.
TARGET_ENVIRONMENT: Final = {
    "host": "PGHOST",
    "port": "PGPORT",
    "database": "PGDATABASE",
    "user": "PGUSER",
    "service": "PGSERVICE",
}


def target_label(target: Mapping[str, object]) -> str:
    """A target for people, as pool keys are labelled: ``user@host:port/database`` (never
    a password). A part not given is libpq's from the environment (``PGUSER``,
    ``PGHOST``, ``PGPORT``, ``PGDATABASE``), as the connection takes it; else it is
    left out, and a missing host shows as ``localhost``."""

    def part(name: str) -> str:
        return _shown(target.get(name)) or os.environ.get(TARGET_ENVIRONMENT[name], "")

    user, host = part("user"), part("host") or "localhost"
    port, database = part("port"), part("database")
    text = f"{f'{user}@' if user else ''}{host}{f':{port}' if port else ''}"
    return printable_label(f"{text}{f'/{database}' if database else ''}")


def _shown(part: object) -> str:
    """A target part as text, no method of a subclass called: a str, an int, or a list of
    them joined by commas; anything else (checked by :func:`database_key`) as empty."""
    if issubclass(type(part), str):
        return str.__str__(cast(str, part))
    if type(part) is int:
        return int.__repr__(part)
    if type(part) in (list, tuple):
        return ",".join(_shown(each) for each in cast("list[object]", part))
    return ""


def dsn_target(dsn: object) -> dict[str, str]:
    """The target parts of a ``postgresql://`` (or ``postgres://``) URL, as asyncpg reads
    it: ``user``, ``host`` and ``port`` from the authority, ``database`` from the path,
    and each from the query (``dbname`` too) when the authority leaves it out.

    Returns:
        The parts found (``host``, ``port``, ``database``, ``user``, ``service``).

    Raises:
        InvalidPoolOptions: not a str, a scheme other than postgresql, a NUL, no
            UTF-8 form, or a URL that cannot be split.
    """
    if not isinstance(dsn, str):
        raise InvalidPoolOptions(f"dsn must be a str, got {shown(dsn)}", key="dsn")
    _text("dsn", dsn)
    try:
        parsed = urllib.parse.urlsplit(dsn)
        query = urllib.parse.parse_qs(parsed.query)
    except ValueError as error:
        raise InvalidPoolOptions(f"dsn {shown(dsn)} is not a URL: {error}", key="dsn") from None
    if parsed.scheme not in SCHEMES:
        raise InvalidPoolOptions(
            f"dsn must be a postgresql:// or postgres:// URL, got {shown(dsn)}", key="dsn"
        )
    userinfo, _, hosts = parsed.netloc.rpartition("@")
    found: dict[str, str] = {}
    user = urllib.parse.unquote(userinfo.partition(":")[0])
    if user:
        found["user"] = user
    if hosts:
        found["host"], found["port"] = _host_list(urllib.parse.unquote(hosts))
    database = urllib.parse.unquote(parsed.path.removeprefix("/"))
    if database:
        found["database"] = database
    for name, aliases in _QUERY_NAMES.items():
        for alias in aliases:
            if not found.get(name) and query.get(alias):
                found[name] = query[alias][-1]
    return {name: value for name, value in found.items() if value}


#: Query parameters that name a target part, by the part.
_QUERY_NAMES: Final[Mapping[str, tuple[str, ...]]] = {
    "host": ("host",),
    "port": ("port",),
    "database": ("dbname", "database"),
    "user": ("user",),
    "service": ("service",),
}


def _host_list(hosts: str) -> tuple[str, str]:
    """``h1:p1,h2,[::1]:p3`` as (``h1,h2,::1``, ``p1,,p3``): hosts and ports apart."""
    names, ports = [], []
    for spec in hosts.split(","):
        if spec.startswith("["):
            name, _, rest = spec[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            name, _, port = spec.partition(":")
        names.append(name)
        ports.append(port)
    return ",".join(names), ",".join(ports) if any(ports) else ""


def _part(name: str, value: object) -> str:
    """A target part as the key spells it ("" when None)."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ",".join(_part(name, one) for one in value)
    if type(value) is int:
        return str(value)
    if isinstance(value, str):
        return _text(name, value)
    raise InvalidPoolOptions(
        f"{name} must be a str, an int or a list of them, got {shown(value)}", key=name
    )


def _text(name: str, value: str) -> str:
    text = str.__str__(value)
    if "\x00" in text:
        raise InvalidPoolOptions(f"{name} has a NUL character", key=name)
    try:
        text.encode()
    except UnicodeEncodeError:
        raise InvalidPoolOptions(f"{name} has no UTF-8 form (a lone surrogate)", key=name) from None
    return text


def _login() -> str:
    """The user's login name, libpq's default role (the uid where none is known)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
