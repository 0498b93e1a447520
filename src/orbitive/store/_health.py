"""Whether a store engine answers, logged when that changes (``orbitive.store``).

Each engine runs its calls inside its :class:`Reachability`: the first call that
cannot reach the engine (``StoreError(UNAVAILABLE)``: a server down or unreachable,
a call past its ``?timeout=``, a SQLite file that stays busy) logs a WARNING with
its cause; the first call that reaches it again logs an INFO with how long it was
away. Calls in between, and every call while it answers, log nothing: a call that
succeeds costs one attribute test.
"""

from __future__ import annotations

import logging
import time
from types import TracebackType

from .._core._errors import ErrorKind, StoreError

_log = logging.getLogger("orbitive.store")


class Reachability:
    """A context manager around each engine call that logs the engine going away and
    coming back (see the module docstring); it never suppresses an exception.

    Args:
        what: the engine as a message names it (``postgres store``).
    """

    __slots__ = ("_since", "_what")

    def __init__(self, what: str) -> None:
        self._what = what
        self._since = 0.0  # time.monotonic() of the first failed call; 0.0 while it answers

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if error is None:
            if self._since:
                away, self._since = time.monotonic() - self._since, 0.0
                _log.info("%s answers again, after %.1f s", self._what, away)
        elif (
            not self._since
            and isinstance(error, StoreError)
            and error.kind is ErrorKind.UNAVAILABLE
        ):
            self._since = time.monotonic()
            _log.warning("%s; its calls fail until it answers again", error)
