"""The event loop `tapfix run` serves on (addons/runner/event_loop.py): uvloop's, which must run what mitmproxy
and httpx ask of asyncio's: mitmproxy's eager task factory, and anyio's task groups under it."""

from __future__ import annotations

import asyncio

import anyio
import pytest
import uvloop
from tapfix.addons.runner import event_loop
from tapfix.addons.runner.master import prepare
from tapfix.addons.runner.setup import StartupError
from tapfix.proxy.config.settings import Settings


def test_uvloop_unless_asked_for_asyncio() -> None:
    assert event_loop.choice({}) == "uvloop"  # a dependency: installed with tapfix
    assert event_loop.choice({"TAPFIX_EVENT_LOOP": "uvloop"}) == "uvloop"
    assert event_loop.choice({"TAPFIX_EVENT_LOOP": " Asyncio "}) == "asyncio"
    assert event_loop.factory({"TAPFIX_EVENT_LOOP": "asyncio"}) is None  # asyncio.run's own loop
    loop_class = event_loop.factory({})
    assert loop_class is not None and issubclass(loop_class, uvloop.Loop)


def test_an_unknown_loop_is_a_one_line_error_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="TAPFIX_EVENT_LOOP 'trio': give uvloop or asyncio"):
        event_loop.choice({"TAPFIX_EVENT_LOOP": "trio"})
    monkeypatch.setenv("TAPFIX_EVENT_LOOP", "trio")
    with pytest.raises(StartupError, match="TAPFIX_EVENT_LOOP 'trio'"):
        prepare(Settings(upstream="http://127.0.0.1:9"), store=None)  # type: ignore[arg-type]  # fails before the store


def run_on_tapfix_loop(main: object) -> object:
    return asyncio.run(main, loop_factory=event_loop.factory({}))  # type: ignore[arg-type]


def test_mitmproxy_eager_task_factory_starts_tasks_at_once() -> None:
    """mitmproxy's `Master.run` sets asyncio's eager task factory; uvloop ≥ 0.23 on Python 3.13 hands a factory an
    `eager_start` keyword that asyncio's of 3.13.0 refuses (TypeError at mitmproxy's first task)."""
    steps: list[str] = []

    async def child() -> str:
        steps.append("child ran")
        await asyncio.sleep(0)
        return "done"

    async def main() -> tuple[str, str]:
        loop = asyncio.get_running_loop()
        loop.set_task_factory(asyncio.eager_task_factory)
        task = asyncio.create_task(child(), name="hook")
        steps.append("created")
        return task.get_name(), await task

    assert run_on_tapfix_loop(main()) == ("hook", "done")
    assert steps == ["child ran", "created"]  # eager: the task ran to its first await inside create_task


def test_anyio_task_groups_and_cancel_scopes_under_the_eager_factory() -> None:
    """httpx runs on anyio, which recognises asyncio's eager factory and starts its own tasks lazily (its cancel
    scopes need it). A loop that wrapped the factory would hide it: anyio's connect_tcp then failed with
    "Attempted to exit a cancel scope that isn't the current tasks's current cancel scope"."""

    async def slow() -> None:
        await anyio.sleep(10)

    async def main() -> list[str]:
        asyncio.get_running_loop().set_task_factory(asyncio.eager_task_factory)
        seen: list[str] = []
        async with anyio.create_task_group() as tg:  # connect_tcp's shape: racing attempts, the winner cancels
            tg.start_soon(slow)
            tg.start_soon(slow)
            await anyio.sleep(0)
            seen.append("started")
            tg.cancel_scope.cancel()
        with anyio.move_on_after(0.01):
            await slow()
        seen.append("moved on")
        return seen

    assert run_on_tapfix_loop(main()) == ["started", "moved on"]
