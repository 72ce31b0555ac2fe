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

import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from mitmproxy import exceptions, hooks
from mitmproxy.addonmanager import AddonManager, traverse
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses

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
            funcs = [f for a in self.chain if (f := _hook_of(a, hook)) is not None]
            if funcs:
                setattr(self, hook, _dispatch(funcs))


def collapse(manager: AddonManager) -> None:
    """Every addon in `manager`'s chain (mitmproxy's own defaults, tapfix's) behind one entry, once they are all
    added (each registered its options and name on `add`; `addons.get` still finds it). mitmproxy's three dozen
    default addons mostly have no hook for a request's events, yet each cost a call per event (issue 34)."""
    manager.chain[:] = [AddonChain(manager.chain)]


def _hook_of(addon: object, hook: str) -> Hook | None:
    """What to call for `hook` on `addon`. An addon with children (mitmproxy's `addons` attribute, such as the
    script loader's scripts) may gain and lose them as it runs: they are walked at each call, as mitmproxy does."""
    if hasattr(addon, "addons"):
        return functools.partial(_children, addon, hook)
    func = getattr(addon, hook, None)
    return func if callable(func) else None


def _children(addon: Any, hook: str, *args: Any) -> Awaitable[None] | None:
    if not addon.addons:  # no children now (the script loader without scripts, tapfix's case): its own hook only
        own = getattr(addon, hook, None)
        return own(*args) if callable(own) else None
    funcs = [f for a in traverse([addon]) if callable(f := getattr(a, hook, None))]
    return _dispatch(funcs)(*args) if funcs else None


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
