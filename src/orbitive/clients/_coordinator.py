"""Coordinator: a budget's two names in the coordinating store, spoken through the
store engine's counting-lease primitives.

* **Units**: the semaphore ``orbitive.budget/NAME`` with ``limit = total``. A
  host holds units as counting leases whose owner is the host's id; its steward
  renews them all in one statement (``renew_units``) and gives some back in one
  (``release_units``). The engine's one-limit rule refuses another ``total`` for
  the same name (:class:`~orbitive._core._errors.BudgetMismatch` here).
* **Posts**: the semaphore ``orbitive.budget-hosts/NAME`` (limit
  :data:`POSTS_LIMIT`), where each host holds one slot whose owner string is the
  host's id and its numbers (:class:`Post`): its total, ``max_live``, units
  held, clients in use and idle, callers waiting and the units it still needs. A
  post is replaced (a new slot, then the old one released) rather than renewed
  when its numbers change, since an owner is fixed for a tenure. Other hosts read
  the posts to learn who needs units; ``orbit budget`` reads them to show the
  hosts.

Why counting leases, not a table of its own: the semaphore primitives already
keep the contract a budget needs (a TTL on the server's clock, owner compare,
batched renew and release, attempt ids that make a retried call answer as the
first, every call bounded by the URL's timeout), on PostgreSQL and Redis alike.
Only the posts bend them: a post carries numbers in its owner string, which the
store treats as an opaque compare token.

Grants travel through the host's shared memory (:mod:`._board`) so that another
process of the host can renew them when the steward changes: :meth:`Coordinator.pack`
turns the engine's grant values into JSON-able lists and :meth:`Coordinator.unpack`
back, for the two engines' grant types only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, final

from .._core._errors import (
    BudgetMismatch,
    BudgetUnavailable,
    ErrorKind,
    InvalidBudget,
    InvalidStoreUrl,
    SemaphoreLimitMismatch,
    StoreError,
    UnsafeCoordinator,
)
from ..store._durability import forgetful
from ..store._engine import Busy, Engine, SlotInfo, UnitGranted
from ..store._redis import RedisUnit
from ..store._url import open_engine
from ._budget import POSTS_PREFIX, UNITS_PREFIX, Budget, check_name, check_url

#: The posts' semaphore limit: hosts that may post at once.
POSTS_LIMIT: Final = 4096
#: The grant types a board may carry, by name.
_GRANTS: Final[dict[str, type[Any]]] = {"UnitGranted": UnitGranted, "RedisUnit": RedisUnit}
#: A post as the steward keeps it: its owner string and its grant.
Posted = tuple[str, Any]
#: The numbers of a post, in the order its owner string carries them.
_POST_FIELDS: Final = ("total", "max_live", "held", "in_use", "idle", "waiting", "need")


@final
@dataclass(frozen=True, slots=True)
class Post:
    """One host's numbers as it last posted them.

    Attributes:
        host: the host's id (``hostname/fleet/random``).
        total: the budget's total as the host knows it.
        max_live: the host's own cap.
        held: units the host held.
        in_use, idle: the host's clients in use and idle.
        waiting: the host's callers waiting for a client.
        need: units the host wants beyond those it holds (0: none).
        expires_at: when the post lapses, on the coordinator's clock (Unix epoch s).
    """

    host: str
    total: int
    max_live: int
    held: int
    in_use: int
    idle: int
    waiting: int
    need: int
    expires_at: float = 0.0

    def owner(self) -> str:
        """The post as the owner string of its slot."""
        numbers = " ".join(str(getattr(self, field)) for field in _POST_FIELDS)
        return f"{self.host} {numbers}"

    @classmethod
    def parse(cls, slot: SlotInfo) -> Post | None:
        """The post a slot's owner carries, or None for an owner that is no post."""
        parts = slot.owner.split(" ")
        if len(parts) != 1 + len(_POST_FIELDS) or not all(p.isdecimal() for p in parts[1:]):
            return None
        total, max_live, held, in_use, idle, waiting, need = (int(p) for p in parts[1:])
        return cls(parts[0], total, max_live, held, in_use, idle, waiting, need, slot.expires_at)


@final
@dataclass(frozen=True, slots=True)
class Survey:
    """What the coordinator holds for a budget at one moment."""

    units: list[SlotInfo]
    posts: list[Post]

    def others_needing(self, host: str) -> list[Post]:
        """The latest post of every other host that needs units."""
        return [post for post in self.latest() if post.host != host and post.need > 0]

    def latest(self) -> list[Post]:
        """One post per host: the one that lapses last (a replaced post may linger)."""
        newest: dict[str, Post] = {}
        for post in self.posts:
            if post.host not in newest or post.expires_at > newest[post.host].expires_at:
                newest[post.host] = post
        return sorted(newest.values(), key=lambda post: post.host)

    def held_by(self, host: str) -> list[SlotInfo]:
        """The live units ``host`` holds."""
        return [unit for unit in self.units if unit.owner == host]


@final
class Coordinator:
    """One budget's names in its coordinating store (see the module).

    Args:
        budget: the budget.
        timeout: the bound on each call, in seconds (None: the budget's
            ``call_timeout``, unless its URL sets one).

    Raises:
        BudgetUnavailable: the coordinator cannot be reached (the store's error
            is the ``__cause__``).
        InvalidBudget: the store refuses the budget's URL.
    """

    def __init__(self, budget: Budget, timeout: float | None = None) -> None:
        self.budget = budget
        self._units, self._posts = budget.units_name, budget.posts_name
        try:
            self._engine: Engine[Any, Any] = open_engine(budget.store_url(timeout))
        except InvalidStoreUrl as error:
            raise InvalidBudget(f"budget {budget.name!r}: {error}", key="url") from error
        except StoreError as error:
            raise _unavailable(budget, error) from error

    # -- at start-up --------------------------------------------------------------------

    def check(self) -> Survey:
        """Refuse a coordinator that may forget its grants, and a total other hosts do not
        share; what it holds now.

        Raises:
            UnsafeCoordinator: Redis without an append-only file, PostgreSQL with
                ``fsync`` or ``synchronous_commit`` off.
            BudgetMismatch: units or posts of the budget are held under another total.
            BudgetUnavailable: the coordinator cannot be reached.
        """
        budget = self.budget
        try:
            problem = forgetful(self._engine)
            survey = self.survey()
        except StoreError as error:
            raise _unavailable(budget, error) from error
        if problem is not None:
            raise UnsafeCoordinator(f"budget {budget.name!r}: {problem}", key=budget.name)
        found = {unit.limit for unit in survey.units} | {post.total for post in survey.latest()}
        found.discard(budget.total)
        if found:
            raise _mismatch(budget, min(found))
        return survey

    # -- the units ----------------------------------------------------------------------

    def acquire(self, host: str) -> Any | None:
        """One more unit for ``host`` for ``ttl`` seconds, or None while ``total`` are held.

        Raises:
            BudgetMismatch: the units are held under another total.
            StoreError: the coordinator cannot be reached (``UNAVAILABLE``).
        """
        try:
            grant = self._engine.acquire_unit(self._units, self.budget.total, host, self.budget.ttl)
        except SemaphoreLimitMismatch as error:
            raise _mismatch(self.budget, error.found) from error
        return None if isinstance(grant, Busy) else grant

    def renew(self, host: str, grants: Sequence[Any]) -> list[Any | None]:
        """A new full ``ttl`` for each of ``host``'s ``grants``, in one statement: each
        renewed grant, or None for one that is gone.

        Raises:
            StoreError: the coordinator cannot be reached (``UNAVAILABLE``).
        """
        if not grants:
            return []
        return self._engine.renew_units(self._units, host, grants, self.budget.ttl)

    def release(self, host: str, grants: Sequence[Any]) -> None:
        """Give ``grants`` back in one statement.

        Raises:
            StoreError: the coordinator cannot be reached (the units then lapse).
        """
        if grants:
            self._engine.release_units(self._units, host, grants)

    # -- the posts ----------------------------------------------------------------------

    def post(self, post: Post, previous: Posted | None) -> Posted | None:
        """Post ``post`` for ``ttl`` seconds, then take ``previous`` down; the new post
        (None if every post slot is held, which leaves ``previous`` up).

        Raises:
            StoreError: the coordinator cannot be reached.
        """
        owner = post.owner()
        grant = self._engine.acquire_unit(self._posts, POSTS_LIMIT, owner, self.budget.ttl)
        if isinstance(grant, Busy):
            return None
        if previous is not None:
            self.unpost(previous)
        return owner, grant

    def unpost(self, posted: Posted) -> None:
        """Take a post down.

        Raises:
            StoreError: the coordinator cannot be reached (the post then lapses).
        """
        owner, grant = posted
        self._engine.release_units(self._posts, owner, [grant])

    def survey(self) -> Survey:
        """The budget's live units and posts (two statements).

        Raises:
            StoreError: the coordinator cannot be reached.
        """
        return _survey(self._engine, self._units, self._posts)

    def posts(self) -> list[Post]:
        """The latest post of every host (one statement).

        Raises:
            StoreError: the coordinator cannot be reached.
        """
        found = [post for slot in self._engine.holders(self._posts) if (post := Post.parse(slot))]
        return Survey([], found).latest()

    # -- grants in shared memory -----------------------------------------------------------

    @staticmethod
    def pack(grant: Any) -> list[Any]:
        """A grant as a JSON-able list: its type's name, then its fields."""
        return [type(grant).__name__, *grant]

    @staticmethod
    def unpack(packed: object) -> Any | None:
        """The grant :meth:`pack` made, or None for anything else (damage)."""
        if not isinstance(packed, list) or not packed or packed[0] not in _GRANTS:
            return None
        kind = _GRANTS[packed[0]]
        with contextlib.suppress(TypeError, ValueError):
            grant = kind(*packed[1:])
            if all(type(value) in (int, float, str) for value in grant):
                return grant
        return None

    def close(self) -> None:
        """Close the engine's connections; idempotent."""
        self._engine.close()


def read_survey(url: str, name: str) -> Survey:
    """What the coordinator at ``url`` holds for the budget ``name``, read by an engine
    opened for the two statements and closed (``orbit budget``); the URL's
    ``?timeout=`` bounds each call (default: the store's).

    Raises:
        InvalidBudget: ``url`` is no PostgreSQL or Redis URL, or ``name`` breaks the
            name rule.
        InvalidStoreUrl: the store refuses the URL.
        StoreError: the coordinator cannot be reached.
    """
    check_url(url)
    check_name(name)
    engine: Engine[Any, Any] = open_engine(url)
    try:
        return _survey(engine, UNITS_PREFIX + name, POSTS_PREFIX + name)
    finally:
        engine.close()


def _survey(engine: Engine[Any, Any], units_name: str, posts_name: str) -> Survey:
    units = engine.holders(units_name)
    posts = [post for slot in engine.holders(posts_name) if (post := Post.parse(slot))]
    return Survey(units, posts)


def _unavailable(budget: Budget, error: StoreError) -> BudgetUnavailable:
    return BudgetUnavailable(
        f"budget {budget.name!r}: the coordinator cannot be reached: {error}",
        key=budget.name,
        kind=ErrorKind.UNAVAILABLE,
    )


def _mismatch(budget: Budget, found: int) -> BudgetMismatch:
    return BudgetMismatch(
        f"budget {budget.name!r} is held under total {found}, not {budget.total}: every "
        "host that names a budget must give it one total",
        key=budget.name,
        total=budget.total,
        found=found,
    )
