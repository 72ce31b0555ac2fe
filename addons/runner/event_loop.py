"""The event loop `tapfix run` serves on: uvloop's where it is installed (a dependency on Linux and macOS),
asyncio's own otherwise or with `TAPFIX_EVENT_LOOP=asyncio`.

Why: at many concurrent streams one core runs out (issue 34's stream lane), and a share of every chunk's
cost is the loop's own: the selector, the transports' reads and writes, the callbacks and task wake-ups.
uvloop does those in C (libuv); mitmproxy's layers, h11 and tapfix's stages stay what they were.

One difference to bridge: mitmproxy runs with asyncio's eager task factory, and uvloop ≥ 0.23 on Python
3.13 passes `eager_start` to a task factory, which asyncio's factory of 3.13.0 does not take (`TypeError`
at mitmproxy's first task). `Loop.create_task` below calls the factory as asyncio's own loop does. The factory stays
asyncio's own object: anyio (httpx's backend) recognises it and starts its tasks lazily, as its cancel
scopes need.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any

VARIABLE = "TAPFIX_EVENT_LOOP"
CHOICES = ("uvloop", "asyncio")


def choice(environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """The loop asked for: `TAPFIX_EVENT_LOOP`, else uvloop where it is installed. ValueError for another
    value, or for uvloop where it isn't."""
    asked = environ.get(VARIABLE, "").strip().lower()
    if asked and asked not in CHOICES:
        raise ValueError(f"{VARIABLE} {asked!r}: give uvloop or asyncio")
    if asked == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if asked == "uvloop":
            raise ValueError(f"{VARIABLE}=uvloop, but uvloop is not installed: pip install uvloop") from None
        return "asyncio"
    return "uvloop"


def factory(environ: dict[str, str] | os._Environ[str] = os.environ) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """For `asyncio.run(..., loop_factory=...)`: None is asyncio's own loop."""
    if choice(environ) == "asyncio":
        return None
    return _uvloop_class()


def _uvloop_class() -> type[asyncio.AbstractEventLoop]:
    import uvloop

    class Loop(uvloop.Loop):
        def create_task(  # type: ignore[override]  # asyncio's signature, not uvloop's stub
            self, coro: Coroutine[Any, Any, Any], *, name: str | None = None, context: Any = None, **kwargs: Any
        ) -> asyncio.Task[Any]:
            task_factory: Any = self.get_task_factory()
            if task_factory is None or kwargs:
                return super().create_task(coro, name=name, context=context, **kwargs)
            task: asyncio.Task[Any] = task_factory(self, coro, context=context)  # as asyncio's loop calls it
            if name is not None:
                task.set_name(name)
            return task

    return Loop
