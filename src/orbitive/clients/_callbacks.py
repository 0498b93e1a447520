"""Calling the user's create, close, check and reset, from sync and asyncio code."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

from .._core._errors import InvalidPoolOptions, shown


def check_callable(name: str, value: object, *, optional: bool) -> None:
    """Refuse a ``create``/``close``/``check``/``reset`` that cannot be called.

    Raises:
        InvalidPoolOptions: not callable (or None where it is required).
    """
    if value is None and optional:
        return
    if not callable(value):
        raise InvalidPoolOptions(f"{name} must be callable, got {shown(value)}", key=name)


def call_sync(name: str, function: Callable[..., Any], *args: object) -> Any:
    """Call ``function`` from sync code; an awaitable result is refused (use the async path).

    Raises:
        InvalidPoolOptions: ``function`` returned an awaitable.
        Whatever ``function`` raises.
    """
    result = function(*args)
    if result is not None and inspect.isawaitable(result):  # None: reset's and check's usual
        if inspect.iscoroutine(result):
            result.close()
        raise InvalidPoolOptions(
            f"{name} returned an awaitable; use client_async() for an asyncio client", key=name
        )
    return result


async def call_async(function: Callable[..., Any], *args: object) -> Any:
    """Call ``function`` without blocking the event loop.

    A coroutine function runs on the loop; anything else runs in a worker
    thread, and an awaitable it returns (a lambda around a coroutine) is then
    awaited on the loop.
    """
    if inspect.iscoroutinefunction(function):
        return await function(*args)
    return await started(function, *args)


def started(function: Callable[..., Any], *args: object) -> asyncio.Future[Any]:
    """Start ``function`` as :func:`call_async` runs it; a future of its outcome.

    The future ends when the callable has ended, whatever befalls the task that
    awaits it: a coroutine function runs as a task of its own, anything else in
    a worker thread, whose outcome lands in a plain future (nothing can be
    thrown into it), after the awaitable it returns, if any, has run on the loop.
    """
    if inspect.iscoroutinefunction(function):
        task: asyncio.Future[Any] = asyncio.ensure_future(function(*args))
        return task
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()
    running = loop.run_in_executor(None, functools.partial(context.run, function, *args))
    running.add_done_callback(lambda ran: _finish(ran, outcome))
    return outcome


def _finish(ran: asyncio.Future[Any], outcome: asyncio.Future[Any]) -> None:
    """Hand ``ran``'s outcome to ``outcome``; an awaitable result runs on the loop first."""
    if outcome.done():  # cancelled by the task that awaited it: the result goes nowhere
        return
    if ran.cancelled():
        outcome.cancel()
    elif (error := ran.exception()) is not None:
        outcome.set_exception(error)
    elif inspect.isawaitable(result := ran.result()):
        asyncio.ensure_future(result).add_done_callback(lambda done: _finish(done, outcome))
    else:
        outcome.set_result(result)


def run_anywhere(function: Callable[..., Any], *args: object) -> Any:
    """Call ``function`` from sync code, running an awaitable result to completion.

    The awaitable runs on a new event loop: in this thread when none runs here,
    else in a helper thread (so a sync ``close()`` inside asyncio code works).

    Raises:
        Whatever ``function`` or its awaitable raises.
    """
    result = function(*args)
    if not inspect.isawaitable(result):
        return result
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_wait(result))
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, asyncio.run(_wait(result))))
        except BaseException as error:  # handed to the calling thread
            outcome.append((False, error))

    helper = threading.Thread(target=run, name="orbit-clients-close")
    helper.start()
    helper.join()
    done, value = outcome[0]
    if not done:
        raise value
    return value


async def _wait(awaitable: Any) -> Any:
    return await awaitable
