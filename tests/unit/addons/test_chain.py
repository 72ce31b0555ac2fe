"""tapfix's addons behind one mitmproxy entry (addons/chain.py): each event reaches the addons that have its
hook, in order, as mitmproxy's own chain would call them, and one addon's exception doesn't stop the rest."""

from __future__ import annotations

import asyncio
import logging

import pytest
from mitmproxy import exceptions
from mitmproxy.proxy.layers.http import HttpRequestHook, HttpResponseHook
from mitmproxy.test import taddons, tflow
from tapfix.addons.chain import AddonChain, collapse


class Tally:
    def __init__(self, name: str, seen: list[str]) -> None:
        self.name, self.seen = name, seen


class SyncRequest(Tally):
    def request(self, flow: object) -> None:
        self.seen.append(f"{self.name}.request")


class AsyncRequest(Tally):
    async def request(self, flow: object) -> None:
        await asyncio.sleep(0)
        self.seen.append(f"{self.name}.request")


class MaybeAwaitable(Tally):
    def response(self, flow: object) -> object:
        self.seen.append(f"{self.name}.response")
        return asyncio.sleep(0)


class Raises(Tally):
    def request(self, flow: object) -> None:
        self.seen.append(f"{self.name}.request")
        raise RuntimeError("boom")


class Halts(Tally):
    def request(self, flow: object) -> None:
        self.seen.append(f"{self.name}.request")
        raise exceptions.AddonHalt


def run_hooks(chain: AddonChain, *events: object) -> None:
    async def run() -> None:
        with taddons.context() as tctx:
            tctx.master.addons.add(chain)
            for event in events:
                await tctx.master.addons.handle_lifecycle(event)  # type: ignore[arg-type]

    asyncio.run(run())


def test_each_event_reaches_the_addons_with_its_hook_in_order() -> None:
    seen: list[str] = []
    f = tflow.tflow(resp=True)
    chain = AddonChain(
        [SyncRequest("a", seen), AsyncRequest("b", seen), MaybeAwaitable("c", seen), SyncRequest("d", seen)]
    )
    run_hooks(chain, HttpRequestHook(f), HttpResponseHook(f))
    assert seen == ["a.request", "b.request", "d.request", "c.response"]
    assert not hasattr(chain, "responseheaders")  # no addon has it: mitmproxy finds nothing to call


def test_an_addons_exception_is_logged_and_the_next_addon_still_runs(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[str] = []
    f = tflow.tflow()
    with caplog.at_level(logging.ERROR):
        run_hooks(
            AddonChain([Raises("a", seen), AsyncRequest("b", seen), Raises("c", seen), SyncRequest("d", seen)]),
            HttpRequestHook(f),
        )
    assert seen == ["a.request", "b.request", "c.request", "d.request"]
    assert [r.getMessage() for r in caplog.records if "Addon error" in r.getMessage()] == ["Addon error: boom"] * 2


def test_addon_halt_ends_the_event_for_the_addons_after() -> None:
    seen: list[str] = []
    f = tflow.tflow()
    run_hooks(AddonChain([SyncRequest("a", seen), Halts("b", seen), SyncRequest("c", seen)]), HttpRequestHook(f))
    assert seen == ["a.request", "b.request"]


class Parent(Tally):
    """An addon with children, as mitmproxy's script loader has its scripts: they may change while it runs."""

    def __init__(self, name: str, seen: list[str]) -> None:
        super().__init__(name, seen)
        self.addons: list[object] = []


def test_collapse_keeps_the_order_and_walks_an_addons_children_at_each_event() -> None:
    seen: list[str] = []
    parent = Parent("p", seen)
    f = tflow.tflow()

    async def run() -> None:
        with taddons.context() as tctx:
            manager = tctx.master.addons
            manager.add(SyncRequest("a", seen), parent, AsyncRequest("b", seen))
            before = list(manager.chain)
            collapse(manager)
            assert len(manager.chain) == 1 and manager.get("a") is before[-3]  # still found by name
            await manager.handle_lifecycle(HttpRequestHook(f))
            parent.addons.append(SyncRequest("child", seen))  # a script loaded while it runs
            await manager.handle_lifecycle(HttpRequestHook(f))

    asyncio.run(run())
    assert seen == ["a.request", "b.request", "a.request", "child.request", "b.request"]
