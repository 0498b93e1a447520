"""``OPTIONS["pool"]`` of a database that uses the engine, read and checked once.

Django's own pool passes ``OPTIONS["pool"]`` to psycopg_pool's
``ConnectionPool``; this engine reads the same entry, with the host-wide
meaning of the client pool's options (:class:`~orbitive.clients.PoolOptions`).
Three of psycopg_pool's names would silently change meaning here, so they are
refused with the name to use instead: ``min_size`` and ``max_size`` (sizes of
one process's pool) and ``max_idle`` given as seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, final

from django.core.exceptions import ImproperlyConfigured

from ..._core._errors import InvalidCapacity, InvalidName, InvalidPoolOptions
from ..._core._fleet import _check_capacity, check_fleet_name
from .._budget import Budget
from .._options import PoolOptions

#: ``OPTIONS["pool"]`` key -> the :class:`PoolOptions` field it sets.
_OPTION_FIELDS: Final = {
    "max_live": "max_live",
    "min_idle": "min_idle",
    "max_idle": "max_idle",
    "max_waiting": "max_waiting",
    "timeout": "acquire_timeout",
    "idle_timeout": "idle_timeout",
    "max_lifetime": "max_lifetime",
    "handoff_after": "handoff_after",
    "handoff_uses": "handoff_uses",
    "mode": "mode",
    "on_session_state": "on_session_state",
}
#: Every key ``OPTIONS["pool"]`` takes.
KEYS: Final = ("fleet", "fleet_capacity", *_OPTION_FIELDS, "budget")

#: The keys of ``OPTIONS["pool"]["budget"]``: :class:`Budget`'s arguments, required first.
_BUDGET_ARGUMENTS: Final = ("url", "name", "total", "ttl", "handover_within")
#: psycopg_pool's arguments that do not carry over, and what to use instead.
_PSYCOPG_POOL_ONLY: Final = {
    "min_size": "min_idle (a warm floor the fleet keeps between its processes)",
    "max_size": "max_live (every process of the fleet counts against it)",
    "open": "nothing: each process opens its pool on its first connection",
    "name": "nothing: the pool is the database's, named by HOST, PORT, NAME and USER",
    "num_workers": "nothing: connections are made by the process that asks for one",
    "reconnect_timeout": "timeout (a failed connect raises at once, it is not retried)",
    "kwargs": "the database's own settings (NAME, USER, ..., OPTIONS)",
    "configure": "nothing: time zone and role are set as Django sets them",
    "check": "CONN_HEALTH_CHECKS (True checks each connection as it is checked out)",
}


@final
@dataclass(frozen=True, slots=True)
class PoolSettings:
    """One database's pool settings, checked.

    Attributes:
        fleet: the fleet's name (1..32 characters of ``[A-Za-z0-9._-]``).
        fleet_capacity: the fleet's node count, an int in 1..4096, or None: the
            fleet's own, or 64 for a new fleet (as ``Fleet.join`` takes it).
        options: the host-wide sizes and timeouts.
        budget: one connection budget shared with other hosts (``"budget"``: a dict
            of :class:`~orbitive.clients.Budget`'s arguments), or None.
    """

    fleet: str
    fleet_capacity: int | None
    options: PoolOptions
    budget: Budget | None = None


def pool_settings(settings_dict: Mapping[str, Any], alias: str) -> PoolSettings | None:
    """The pool settings of one ``DATABASES`` entry; None when it asks for no pool.

    ``OPTIONS["pool"]`` set to False or None asks for no pool, as with Django's
    own (Django's tests bypass the pool that way): each connection is then
    opened and closed directly.

    Args:
        settings_dict: the ``DATABASES[alias]`` dict (Django has filled in its defaults).
        alias: the database's alias, for the messages.

    Returns:
        The checked :class:`PoolSettings`, or None.

    Raises:
        ImproperlyConfigured: ``OPTIONS`` has no ``"pool"`` entry; it is not a
            dict (True included: this pool needs a fleet); a key is unknown or
            psycopg_pool's (the message names the one to use); ``"fleet"`` is
            missing or not a fleet name; a value is out of range or of the
            wrong type; ``CONN_MAX_AGE`` is not 0.
    """
    where = f"DATABASES[{alias!r}]['OPTIONS']['pool']"
    options = settings_dict.get("OPTIONS") or {}
    if "pool" not in options:
        raise ImproperlyConfigured(
            f"the orbitive.clients.django engine needs {where}, a dict such as "
            "{'fleet': 'web', 'max_live': 8}; False opens every connection directly"
        )
    given = options["pool"]
    if given is False or given is None:
        return None
    if settings_dict.get("CONN_MAX_AGE", 0) != 0:
        raise ImproperlyConfigured(
            "Pooling doesn't support persistent connections. Set CONN_MAX_AGE to 0 for "
            f"DATABASES[{alias!r}]: each request returns its connection to the host-wide "
            "pool, and the pool's max_lifetime bounds a connection's age"
        )
    if not isinstance(given, dict):
        raise ImproperlyConfigured(
            f"{where} must be a dict with a 'fleet' name, such as "
            f"{{'fleet': 'web', 'max_live': 8}}, got {given!r:.60}"
        )
    return _checked(given, where)


def _checked(given: dict[Any, Any], where: str) -> PoolSettings:
    for name in given:
        if name in _PSYCOPG_POOL_ONLY:
            raise ImproperlyConfigured(
                f"{where}[{name!r}] is psycopg_pool's, whose pool is one process's; "
                f"here the pool is host-wide: use {_PSYCOPG_POOL_ONLY[name]}"
            )
        if name not in KEYS:
            raise ImproperlyConfigured(
                f"{where} has an unknown key {name!r:.60}; it takes {', '.join(KEYS)}"
            )
    if "fleet" not in given:
        raise ImproperlyConfigured(
            f"{where} needs 'fleet', the name of the fleet whose processes share the "
            "pool's limits (every worker of the host gives the same name)"
        )
    max_idle = given.get("max_idle")
    if isinstance(max_idle, float):
        raise ImproperlyConfigured(
            f"{where}['max_idle'] counts idle connections host-wide (an int), got "
            f"{max_idle!r}; psycopg_pool's max_idle in seconds is idle_timeout here"
        )
    try:
        fleet = check_fleet_name(given["fleet"])
        capacity = given.get("fleet_capacity")
        if capacity is not None:
            _check_capacity(capacity)
        fields = {_OPTION_FIELDS[name]: given[name] for name in _OPTION_FIELDS if name in given}
        pool_options = PoolOptions(**fields)
        budget = _budget(given.get("budget"), where, pool_options)
    except (InvalidName, InvalidCapacity, InvalidPoolOptions) as error:
        message = str(error).replace("acquire_timeout", "timeout")
        raise ImproperlyConfigured(f"{where}: {message}") from error
    return PoolSettings(fleet, capacity, pool_options, budget)


def _budget(given: object, where: str, options: PoolOptions) -> Budget | None:
    """``"budget"``: None, or a dict of Budget's arguments that fits ``options``.

    Raises:
        ImproperlyConfigured: not a dict, or an argument Budget does not take.
        InvalidBudget: as :class:`~orbitive.clients.Budget` and its ``check_fits``.
    """
    if given is None:
        return None
    if not isinstance(given, dict):
        raise ImproperlyConfigured(
            f"{where}['budget'] must be a dict of Budget's arguments, such as "
            f"{{'url': 'postgresql://app@db/main', 'name': 'main-db', 'total': 20}}, "
            f"got {given!r:.60}"
        )
    unknown = set(given) - set(_BUDGET_ARGUMENTS)
    if unknown:
        raise ImproperlyConfigured(
            f"{where}['budget'] has an unknown key {min(unknown, key=str)!r:.60}; it "
            f"takes {', '.join(_BUDGET_ARGUMENTS)}"
        )
    missing = [name for name in _BUDGET_ARGUMENTS[:3] if name not in given]
    if missing:
        raise ImproperlyConfigured(f"{where}['budget'] needs {', '.join(missing)}")
    budget = Budget(**given)
    budget.check_fits(options)
    return budget
