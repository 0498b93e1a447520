"""Guards that give capacity back: an accepted unit (Execution) and a creation claim.

``Execution`` has a C twin in ``_fastpath.c``, built by the C ``Pool.accept``: the
same attributes and methods, a C finaliser instead of ``__del__``, and a
``complete()`` that is one C call. Where the C module is built, ``Execution`` is
that twin (``PythonExecution`` is this module's reference); both call
:func:`finalise` when one is dropped without ``complete()``.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import TYPE_CHECKING, final

from .._core import _fork
from ._table import Table
from ._values import Key, ResourceId


@final
class Execution:
    """One accepted unit of a resource, in use by its owner.

    ``complete()`` (or leaving the ``with`` block) gives the unit back; that is the
    only way accepted capacity returns (the pool contract). An Execution dropped without
    ``complete()`` warns (``ResourceWarning``) and gives the unit back too. A
    forked child's copy never completes the parent's unit.
    """

    __slots__ = ("_done", "_fork", "_offset", "_table", "fence", "id")

    def __init__(self, table: Table, rid: ResourceId, fence: int, offset: int) -> None:
        self._table = table
        self._offset = offset
        self._fork = _fork.generation
        self._done = False
        #: The resource, and the fence this unit was accepted under (0: register_active).
        self.id = rid
        self.fence = fence

    @property
    def done(self) -> bool:
        """True once the unit was given back."""
        return self._done

    def complete(self) -> None:
        """Give the unit back and wake the key's waiters. Idempotent.

        Does nothing if the resource was closed or its slot reused meanwhile.
        """
        if self._done:
            return
        self._done = True
        if self._fork == _fork.generation:
            self._table.complete(self._offset, self.id.generation, self.id.epoch)

    def __enter__(self) -> Execution:
        return self

    def __exit__(self, *exc: object) -> None:
        self.complete()

    def __del__(self) -> None:
        if getattr(self, "_done", True) or self._fork != _fork.generation:
            return
        finalise(self, self._table, self._offset, self.id.generation, self.id.epoch)
        self._done = True

    def __repr__(self) -> str:
        state = "done" if getattr(self, "_done", True) else "active"
        return f"<Execution {getattr(self, 'id', '?')} fence={getattr(self, 'fence', '?')} {state}>"


def finalise(execution: object, table: Table, offset: int, generation: int, epoch: int) -> None:
    """An Execution dropped without ``complete()``: give its unit back, and warn.

    The step runs after the critical section this thread may be inside (a
    finaliser can run anywhere), see ``Table.run_soon``.
    """
    message = f"{execution!r} was never completed; its unit was given back by the finaliser"
    table.run_soon(lambda: table.complete(offset, generation, epoch))
    warnings.warn(message, ResourceWarning, stacklevel=2)


#: The reference twin (and ``Execution`` where the C module is not built).
PythonExecution = Execution
if not TYPE_CHECKING:
    with contextlib.suppress(ImportError):  # not built (no C compiler): the Python twin
        from ._fastpath import Execution


@final
class CreationPermit:
    """A creation claim: counts as "creating" for its key until finished or dropped.

    ``finish()`` (or leaving the ``with`` block, or dropping the permit) returns
    the claim. Register the new resource before finishing, so live + creating
    never dips below what exists.
    """

    __slots__ = ("_done", "_epoch", "_fork", "_index", "_node", "_table", "key")

    def __init__(self, table: Table, key: Key, claimed: tuple[int, int]) -> None:
        self._table = table
        self._index, self._epoch = claimed
        self._node = table.node
        self._fork = _fork.generation
        self._done = False
        #: The key the claim counts against.
        self.key = key

    def finish(self) -> None:
        """Return the claim and wake the key's waiters. Idempotent."""
        if self._done:
            return
        self._done = True
        if self._fork == _fork.generation:
            self._table.unclaim(self.key, self._index, self._node, self._epoch)

    def __enter__(self) -> CreationPermit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.finish()

    def __del__(self) -> None:
        if getattr(self, "_done", True) or self._fork != _fork.generation:
            return
        self._done = True
        table, key, index, node, epoch = (
            self._table, self.key, self._index, self._node, self._epoch
        )  # fmt: skip
        table.run_soon(lambda: table.unclaim(key, index, node, epoch))

    def __repr__(self) -> str:
        state = "finished" if getattr(self, "_done", True) else "claimed"
        return f"<CreationPermit key={getattr(self, 'key', '?')} {state}>"
