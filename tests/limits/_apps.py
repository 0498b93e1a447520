"""The rate-limit recipes' applications (docs/recipes.md, "Rate limits across workers"),
served as written but wrapped so that every response, a 429 or a 404 too, names the
worker that answered it in ``X-Worker-Pid``.

gunicorn serves ``tests.limits._apps:flask_app`` and uvicorn
``tests.limits._apps:fastapi_app``; each imports its recipe (``limited_flask``,
``limited_fastapi``, written into a folder on ``PYTHONPATH``) in the worker only, as
the recipe's own command line does.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Final

#: The header each wrapped response carries: the answering worker's process id.
PID_HEADER: Final = "X-Worker-Pid"

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Send = Callable[[_Message], Awaitable[None]]
_Receive = Callable[[], Awaitable[_Message]]


def _recipe_app(module: str) -> Any:
    return importlib.import_module(module).app


def flask_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """limited_flask's app (a WSGI one), each response with the worker's pid."""

    def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        return start_response(status, [*headers, (PID_HEADER, str(os.getpid()))], exc_info)

    answer: Iterable[bytes] = _recipe_app("limited_flask")(environ, start)
    return answer


async def fastapi_app(scope: _Scope, receive: _Receive, send: _Send) -> None:
    """limited_fastapi's app (an ASGI one), each response with the worker's pid."""

    async def sending(message: _Message) -> None:
        if message["type"] == "http.response.start":
            pid = (PID_HEADER.lower().encode(), str(os.getpid()).encode())
            message["headers"] = [*message.get("headers", ()), pid]
        await send(message)

    await _recipe_app("limited_fastapi")(scope, receive, sending)
