"""Budget: one connection budget shared by every host that names it.

A :class:`Budget` is a value: the coordinator's URL, the budget's name, its
``total`` and the times that follow from its ``ttl``. Every pool of every host
that names the same budget counts against one ``total``; the parts that make it
hold are :mod:`._coordinator` (the budget's names in the coordinating store),
:mod:`._board` (a host's units in its shared memory), :mod:`._steward` (the one
process of a host that holds them) and :mod:`._allowance` (what every process of
the host may create).

The times, from ``ttl`` (seconds):

============================  ===============  ========================================
what                          default (ttl 10)  rule
============================  ===============  ========================================
a unit lapses unrenewed       10 s             ``ttl``
the host renews its units     every 2.5 s      ``ttl / 4``, in one statement
a coordinator call ends       within 2.5 s     ``ttl / 4`` (at most 5 s); the URL's
                                               ``?timeout=`` if given (0.05 s to
                                               ``ttl / 4``; the check at start-up:
                                               5 s)
the host stops creating and   2.5 s before     ``ttl / 4`` before the lease may lapse,
retires its idle clients      the lapse        counted from when the renewal was sent
it severs clients in use      1.25 s before    ``ttl / 8`` before it
another process of the host   0.625 s late     the steward's next act is due (its next
takes the steward's place                      call's bound, or the end of its sleep)
                                               plus ``ttl / 16``
============================  ===============  ========================================

``handover_within`` (default 2 s) bounds how long a host holds idle clients while
another host waits; the steward looks at the other hosts every quarter of it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final, cast, final

from .._core._errors import InvalidBudget, InvalidStoreUrl, shown
from ..pool import Key
from ..store._network import TIMEOUT_MIN_S, split_param
from ._options import PoolOptions

#: Largest ``total`` (a counting lease admits at most this many holders).
TOTAL_MAX: Final = 4096
#: Longest budget name, in UTF-8 bytes (the coordinator prefixes its names).
NAME_MAX_BYTES: Final = 200
#: Shortest and longest ``ttl``, in seconds.
TTL_MIN_S: Final = 1.0
TTL_MAX_S: Final = 3600.0
#: Shortest ``handover_within``, in seconds.
HANDOVER_MIN_S: Final = 0.1
#: Longest coordinator call, in seconds, when the URL sets none.
CALL_TIMEOUT_MAX_S: Final = 5.0
#: The URL schemes of a coordinator: PostgreSQL and Redis (a budget spans hosts).
SCHEMES: Final = ("postgresql", "postgres", "redis", "rediss", "unix")
#: Prefixes of the coordinator's two names for a budget: its units, and the hosts' posts.
UNITS_PREFIX: Final = "orbitive.budget/"
POSTS_PREFIX: Final = "orbitive.budget-hosts/"
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SCHEME: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")


@final
@dataclass(frozen=True, slots=True)
class Budget:
    """One connection budget shared by every host that names it.

    The fleets of every host whose pools name the same budget never hold more
    than ``total`` live clients between them; each pool's ``max_live`` still caps
    its own host. A host holds *units* of the budget as counting leases in the
    coordinator (``orbitive.store`` semaphores): one process of the host, its
    *steward*, takes units as the host's demand grows, renews them all in one
    statement, and gives them back when another host waits. A checkout on a host
    that holds a free unit makes no network round trip.

    Args:
        url: the coordinator: a PostgreSQL URL (``postgresql://...``, possibly the
            database being capped) or a Redis one (``redis://``, ``rediss://``,
            ``unix://``), as :func:`orbitive.store.open_store` takes it. Its
            ``?timeout=`` (seconds a coordinator call takes at most) is in
            ``0.05..ttl / 4``: the store's least bound, within which a round trip
            fits, up to the renewal period, so that a failed renewal is tried
            again before the units lapse.
        name: the budget's name, a str of 1..200 UTF-8 bytes without control
            characters; every host that names it shares its ``total``.
        total: live clients across every host, an int in 1..4096.
        ttl: seconds a host's units stay held without a renewal (float in
            1..3600): how long the units of a dead host stay taken.
        handover_within: seconds (float, at least 0.1, at most ``ttl``) within
            which a host holding idle clients gives their units to a host whose
            callers wait.

    Raises:
        InvalidBudget: an argument breaks its rule (a bool is no number), the
            URL is not a PostgreSQL or Redis one, or its ``?timeout=`` is given
            twice or is not seconds in ``0.05..ttl / 4``.

    Example::

        budget = Budget("postgresql://coord@db/app", name="main-db", total=20)
        pool = ConnectionPool("postgresql://app@db/app", fleet=fleet,
                              options=PoolOptions(max_live=8), budget=budget)
    """

    url: str
    name: str
    total: int
    ttl: float = 10.0
    handover_within: float = 2.0

    def __post_init__(self) -> None:
        check_url(self.url)
        check_name(self.name)
        total = self.total
        if type(total) is not int or not 1 <= total <= TOTAL_MAX:
            raise InvalidBudget(
                f"budget total must be an int in 1..{TOTAL_MAX}, got {shown(total)}", key="total"
            )
        ttl = _seconds("ttl", self.ttl, TTL_MIN_S, TTL_MAX_S)
        handover = _seconds("handover_within", self.handover_within, HANDOVER_MIN_S, ttl)
        object.__setattr__(self, "ttl", ttl)
        object.__setattr__(self, "handover_within", handover)
        check_timeout(self.url, ttl)

    # -- what follows from it --------------------------------------------------------

    @property
    def key(self) -> Key:
        """The pool key of the budget's clients on a host: every pool that names it
        counts against one ``max_live`` and one share of ``total``."""
        return Key.digest(f"orbitive budget\0{self.name}".encode())

    @property
    def units_name(self) -> str:
        """The coordinator's semaphore whose ``total`` slots are the budget's units."""
        return UNITS_PREFIX + self.name

    @property
    def posts_name(self) -> str:
        """The coordinator's semaphore where each host posts its demand (one slot each)."""
        return POSTS_PREFIX + self.name

    def store_url(self, timeout: float | None = None) -> str:
        """The URL a coordinator opens: ``url`` with a ``?timeout=`` of ``timeout`` seconds
        (None: :attr:`call_timeout`), unless the URL gives one."""
        if split_param(self.url, "timeout")[1] is not None:
            return self.url
        base, _, rest = self.url.partition("?")
        query, hash_mark, fragment = rest.partition("#")
        query = f"{query}&" if query else ""
        seconds = self.call_timeout if timeout is None else timeout
        return f"{base}?{query}timeout={seconds:g}{hash_mark}{fragment}"

    @property
    def call_timeout(self) -> float:
        """Seconds a coordinator call takes at most (PostgreSQL: plus up to 2 s when it
        must reconnect, libpq's least connect timeout)."""
        given = split_param(self.url, "timeout")[1]
        return _float(given) if given is not None else min(CALL_TIMEOUT_MAX_S, self.ttl / 4)

    @property
    def renew_every(self) -> float:
        """Seconds between two renewals of a host's units."""
        return self.ttl / 4

    @property
    def stop_lead(self) -> float:
        """Seconds before its units may lapse that a host stops creating and retires idle
        clients (returns retire from then on)."""
        return self.ttl / 4

    @property
    def sever_lead(self) -> float:
        """Seconds before its units may lapse that a host severs the clients still in use."""
        return self.ttl / 8

    @property
    def steward_grace(self) -> float:
        """Seconds a steward may be late for its next act (a call, or the end of a sleep)
        before another process of the host takes its place."""
        return self.ttl / 16

    @property
    def look_every(self) -> float:
        """Seconds between two looks of a steward at the other hosts, while it holds idle
        clients or waits for units."""
        return self.handover_within / 4

    def check_fits(self, options: PoolOptions) -> None:
        """Refuse a pool whose warm floor the budget could never hold.

        Raises:
            InvalidBudget: ``options.min_idle`` is above ``total``.
        """
        if options.min_idle > self.total:
            raise InvalidBudget(
                f"budget {self.name!r}: total {self.total} is below the pool's min_idle "
                f"{options.min_idle}: the warm floor could never be held",
                key="total",
            )

    def __repr__(self) -> str:
        return (
            f"Budget({_redacted(self.url)!r}, name={self.name!r}, total={self.total}, "
            f"ttl={self.ttl:g}, handover_within={self.handover_within:g})"
        )


def check_url(url: object) -> None:
    """Refuse a coordinator URL that is no str or no PostgreSQL or Redis URL.

    Raises:
        InvalidBudget: it is.
    """
    if not issubclass(type(url), str):
        raise InvalidBudget(f"budget url must be a str, got {shown(url)}", key="url")
    text = str.__str__(cast(str, url))
    match = _SCHEME.match(text)
    if match is None or match.group(1).lower() not in SCHEMES:
        raise InvalidBudget(
            f"budget url {_redacted(text)!r} must be a PostgreSQL or Redis URL "
            "(postgresql://, redis://, rediss://, unix://): a budget spans hosts",
            key="url",
        )


def check_timeout(url: str, ttl: float) -> None:
    """Refuse a coordinator URL whose ``?timeout=`` is given twice or is not seconds in
    ``TIMEOUT_MIN_S..ttl / 4`` (``ttl`` in seconds); a URL without one passes.

    Raises:
        InvalidBudget: it is (``key == "url"``).
    """
    try:
        _, timeout = split_param(url, "timeout")
    except InvalidStoreUrl as error:
        raise InvalidBudget(f"the coordinator URL: {error.message}", key="url") from None
    if timeout is not None and not TIMEOUT_MIN_S <= _float(timeout) <= ttl / 4:  # NaN too
        raise InvalidBudget(
            f"the coordinator URL's timeout={timeout:.20} must be seconds in "
            f"{TIMEOUT_MIN_S:g}..{ttl / 4:g} (ttl / 4): a coordinator call needs at least "
            f"{TIMEOUT_MIN_S:g} s, and a renewal must be able to fail and be tried again "
            "before the units lapse",
            key="url",
        )


def check_name(name: object) -> None:
    """Refuse a budget name that is no str of 1..200 UTF-8 bytes without control characters.

    Raises:
        InvalidBudget: it is.
    """
    if type(name) is not str:
        raise InvalidBudget(f"budget name must be a str, got {shown(name)}", key="name")
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        raise InvalidBudget(f"budget name {shown(name)} is not valid UTF-8", key="name") from None
    if not 0 < size <= NAME_MAX_BYTES or _CONTROL.search(name):
        raise InvalidBudget(
            f"budget name must be 1..{NAME_MAX_BYTES} UTF-8 bytes without control "
            f"characters, got {shown(name)}",
            key="name",
        )


def _seconds(name: str, value: object, low: float, high: float) -> float:
    if type(value) is not int and type(value) is not float:
        raise InvalidBudget(
            f"budget {name} must be seconds as a float, got {shown(value)}", key=name
        )
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not low <= seconds <= high:  # also false for NaN
        raise InvalidBudget(
            f"budget {name} must be seconds in {low:g}..{high:g}, got {shown(value)}", key=name
        )
    return seconds


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _redacted(url: str) -> str:
    """``url`` with any password replaced by ``***``."""
    return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)
