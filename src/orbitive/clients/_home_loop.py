"""The event loop a pool's connections live on, and running their coroutines there.

An asyncpg connection belongs to the loop that opened it: its transport and
futures are that loop's, so it can be used, and closed, only by coroutines on
that loop. A :class:`~orbitive.clients.ClientPool` calls ``create`` and
``close`` from elsewhere too: its upkeep thread refills ``min_idle`` and
retires idle clients for another process's waiter, and its closing threads
close the clients that returns handed over, each running a coroutine callable
on a loop of its own. :meth:`HomeLoop.run` sends such a coroutine to the home
loop and waits for it there, so the connection only ever sees its own loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar, final

from .._core._errors import PoolClosed

T = TypeVar("T")


class LoopGone(Exception):
    """The home loop is closed, or did not run the coroutine within the bound."""


@final
class HomeLoop:
    """The loop that owns a pool's connections (bound by the first :meth:`bind`)."""

    __slots__ = ("loop",)

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None

    def bind(self) -> asyncio.AbstractEventLoop:
        """The home loop, bound to the running loop on the first call.

        Raises:
            PoolClosed: no loop runs in this thread (a pool of asyncio connections
                opens inside a coroutine).
        """
        if self.loop is None:
            try:
                self.loop = asyncio.get_running_loop()
            except RuntimeError:
                raise PoolClosed(
                    "an asyncio pool opens inside a coroutine, on the loop that uses it"
                ) from None
        return self.loop

    def here(self) -> bool:
        """Whether the running loop (if any) is the home loop."""
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    async def run(
        self, work: Callable[[], Coroutine[Any, Any, T]], timeout: float | None = None
    ) -> T:
        """``await work()`` on the home loop, from whichever loop runs this.

        Args:
            work: makes the coroutine (called on this loop's side, at most once).
            timeout: seconds to wait for the home loop at most (None: no bound);
                only when this is not the home loop.

        Returns:
            What the coroutine returned.

        Raises:
            LoopGone: the home loop is closed, or did not finish within ``timeout``
                (the coroutine is then cancelled there).
            Whatever the coroutine raises.
        """
        home = self.loop
        if home is None or self.here():
            return await work()
        if home.is_closed():
            raise LoopGone("the pool's event loop is closed")
        coroutine = work()
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, home)
        except RuntimeError:  # closed in between
            coroutine.close()
            raise LoopGone("the pool's event loop is closed") from None
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except asyncio.TimeoutError:
            raise LoopGone(f"the pool's event loop did not answer within {timeout} s") from None
