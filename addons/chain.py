"""tapfix's addons as one entry in mitmproxy's addon chain, each event handed only to the addons with its hook.

Why: mitmproxy calls every addon in its chain for every event, whether the addon has that hook or not (a
coroutine, a context manager, a walk of the addon's children and a getattr each), and a request is about ten
events (its four flow hooks, an `update` after each, the connection's own). tapfix's dozen addons paid that
a dozen times per event on the main thread (issue 34). Behind one entry an event tapfix has no hook for costs
one lookup, and one it has calls just the addons that define it, in the chain's order, with no coroutine
unless one of them returns an awaitable.

What mitmproxy does around each addon's call is kept: an exception is logged as its "Addon error" and the next
addon still runs; AddonHalt and OptionsError go on up (the first ends the event, as it would in mitmproxy).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from mitmproxy import exceptions, hooks

# mitmproxy's own logger and words for an addon's exception (addonmanager.safecall): logs read the same
log = logging.getLogger("mitmproxy.addonmanager")
PASSED_ON = (exceptions.AddonHalt, exceptions.OptionsError)
Hook = Callable[..., Any]


class AddonChain:
    """The addons, in order; for each mitmproxy hook at least one of them has, a method of that name."""

    name = "tapfix"  # its name in mitmproxy's addon lookup

    def __init__(self, addons: Sequence[object]) -> None:
        self.chain = list(addons)  # not `addons`: mitmproxy would walk that attribute as children, and call them too
        for hook in sorted({*hooks.all_hooks, "load", "configure"}):
            funcs = [f for a in self.chain if callable(f := getattr(a, hook, None))]
            if funcs:
                setattr(self, hook, _dispatch(funcs))


def _dispatch(funcs: list[Hook]) -> Hook:
    def call(*args: Any) -> Awaitable[None] | None:
        for i, func in enumerate(funcs):
            try:
                result = func(*args)
            except PASSED_ON:
                raise
            except Exception as e:
                log.error(f"Addon error: {e}", exc_info=True)
                continue
            if result is not None and inspect.isawaitable(result):
                return _rest(result, funcs[i + 1 :], args)
        return None

    return call


async def _rest(pending: Awaitable[Any], funcs: list[Hook], args: tuple[Any, ...]) -> None:
    """The event's remaining calls once an addon's hook returned an awaitable: it first, each in turn."""
    try:
        await pending
    except PASSED_ON:
        raise
    except Exception as e:
        log.error(f"Addon error: {e}", exc_info=True)
    for func in funcs:
        try:
            result = func(*args)
            if result is not None and inspect.isawaitable(result):
                await result
        except PASSED_ON:
            raise
        except Exception as e:
            log.error(f"Addon error: {e}", exc_info=True)
