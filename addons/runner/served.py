"""What each routed upstream serves (its `GET /v1/models`), asked off the request path's critical work and kept
for a while: a route whose model isn't served is not taken (issue 38, request/routes.py). An upstream that
doesn't answer is "not known" (the route is not rejected for it: reaching it is the connection check's)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable

import httpx
from tapfix.proxy.config.file import Config
from tapfix.proxy.request.preflight import models_url
from tapfix.proxy.window.sources import from_models

FRESH_FOR_S = 60.0  # a listing is asked again after this long
RETRY_AFTER_S = 10.0  # an upstream that didn't answer is asked again after this long
ASK_TIMEOUT_S = 3.0


class ServedModels:
    def __init__(self, config: Config, insecure: bool = False) -> None:
        self.config = config
        self.insecure = insecure
        self.served: dict[str, frozenset[str]] = {}
        self.windows: dict[tuple[str, str], int] = {}  # (upstream, id) → max_model_len where listed
        self._next: dict[str, float] = {}
        self._client: httpx.AsyncClient | None = None
        self._asking: set[str] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def routed_upstreams(self) -> set[str]:
        """The upstreams a model with routes may send to (its own and its routes')."""
        names: set[str] = set()
        for m in self.config.models.values():
            if m.routes:
                names.add(m.upstream)
                names.update(u for r in m.routes for u in r.upstreams)
        return names

    async def refresh(self, names: Iterable[str]) -> None:
        """Asks each upstream that is due: awaited the first time (the first request's routes need the lists),
        in the background after that (a request never waits for a listing it already has one of)."""
        now = time.monotonic()
        due = [n for n in names if self._next.get(n, 0.0) <= now and n not in self._asking]
        first = [n for n in due if n not in self._next]
        later = [n for n in due if n in self._next]
        for name in later:
            self._asking.add(name)
            task = asyncio.create_task(self._ask(name))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if first:
            await asyncio.gather(*(self._ask(n) for n in first))

    async def _ask(self, name: str) -> None:
        try:
            await self._listing(name)
        finally:
            self._asking.discard(name)

    async def _listing(self, name: str) -> None:
        upstream = self.config.upstreams[name]
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=ASK_TIMEOUT_S, verify=not self.insecure)
        try:
            answer = await self._client.get(models_url(upstream.base_url), headers=upstream.auth_headers(os.environ))
            listing = answer.json() if answer.status_code == 200 else None
            data = listing.get("data") if isinstance(listing, dict) else None
        except (httpx.HTTPError, ValueError):
            data = None
        if not isinstance(data, list):
            self._next[name] = time.monotonic() + RETRY_AFTER_S
            return
        ids = frozenset(e["id"] for e in data if isinstance(e, dict) and isinstance(e.get("id"), str))
        self.served[name] = ids
        for model in ids:
            window = from_models(listing, model)
            if window:
                self.windows[(name, model)] = window
        self._next[name] = time.monotonic() + FRESH_FOR_S

    async def done(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._client is not None:
            await self._client.aclose()
