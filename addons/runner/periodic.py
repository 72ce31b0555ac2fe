"""Background work an addon repeats for as long as the proxy runs (health probes, reading context windows)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger("tapfix")


async def every(interval: float, work: Callable[[], Awaitable[None]], what: str) -> None:
    """`work` now and then every `interval` seconds, until cancelled. A round that fails is logged (`what`
    failed) and the next one still runs: background work must never take the proxy down."""
    while True:
        try:
            await work()
        except Exception as e:  # noqa: BLE001 - see the docstring
            log.warning("%s failed: %s", what, e)
        await asyncio.sleep(interval)
