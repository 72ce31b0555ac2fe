"""Window: knows each upstream's context window, clamps max_tokens to what it leaves, and turns an engine's
overflow error into the surface's standard one (the stream stage is armed by the stream owner,
addons/stream.py). The logic is in `tapfix.proxy.window`; the engine is asked over HTTP, never blocking the
event loop."""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx
import orjson
from mitmproxy import http
from tapfix.addons.runner.http import answer_locally
from tapfix.addons.runner.runtime import Runtime, exchange_of
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses
from tapfix.proxy.changes import Change
from tapfix.proxy.config.upstream import UpstreamTarget
from tapfix.proxy.errors import context_overflow
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.jsonbody import json_object
from tapfix.proxy.jsonsplice import Set, splice
from tapfix.proxy.request.routing import resolve
from tapfix.proxy.surfaces import surface_for
from tapfix.proxy.window.clamp import BUDGET_KEY, chat_messages, clamped, might_not_fit
from tapfix.proxy.window.rewrite import FLAG, rewrite_body
from tapfix.proxy.window.sources import probes_for

log = logging.getLogger("tapfix")
ASK_TIMEOUT_S = 10.0
# An engine that didn't tell its window is asked again only after this long (issue 34: not once per request,
# which cost every request of the agents' path an upstream round trip before it was sent).
UNKNOWN_FOR_S = 60.0


class Window:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._client: httpx.AsyncClient | None = None

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=ASK_TIMEOUT_S, verify=not self.runtime.settings.insecure)
        return self._client

    async def done(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    # -- the window -------------------------------------------------------------------------------
    def configured(self, ex: Exchange) -> tuple[int, str] | None:
        """`[models.X] context_window` (config mode) or `--context-window` (quick mode): it wins."""
        config = getattr(self.runtime.policy, "config", None)
        if "route_window" in ex.extra:  # issue 38: the route taken's own window, else what its engine says
            routed: tuple[int, str] | None = ex.extra["route_window"]
            return routed
        if config is not None and not config.is_quick:
            own = getattr(resolve(config, ex.model), "settings", None)
            if own is not None and own.context_window:
                return own.context_window, f"config models.{own.name}.context_window"
            return None
        if self.runtime.settings.context_window:
            return self.runtime.settings.context_window, "--context-window"
        return None

    async def reported(self, target: UpstreamTarget, served: str, engine: str | None) -> tuple[int, str] | None:
        """What the engine itself says, asked once and cached (asked again after an overflow)."""
        key = (target.name, served)
        if key in self.runtime.windows:
            return self.runtime.windows[key]
        if self.runtime.windows_unknown.get(key, 0.0) > time.monotonic():
            return None
        for path, read in probes_for(engine):
            try:
                answer = await self.client().get(self._url(target, path))
                found = read(answer.json(), served) if answer.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                found = None
            if found:
                self.runtime.windows[key] = (found, f"GET {path}")
                return self.runtime.windows[key]
        self.runtime.windows_unknown[key] = time.monotonic() + UNKNOWN_FOR_S
        return None

    @staticmethod
    def _url(target: UpstreamTarget, path: str) -> str:
        if path.startswith("/v1/"):
            return target.origin + target.join(path)
        return target.origin + target.prefix.removesuffix("/v1") + path  # llama.cpp's /props, /tokenize

    async def count(self, target: UpstreamTarget, engine: str | None, messages: list[Any], served: str) -> int | None:
        """The prompt's tokens by the engine's own tokenizer, chat template applied: vLLM and SGLang
        `POST /tokenize` with the messages; llama.cpp `/apply-template` then `/tokenize`. None: it can't say."""
        client = self.client()
        try:
            if engine == "llamacpp":
                applied = await client.post(self._url(target, "/apply-template"), json={"messages": messages})
                prompt = applied.json().get("prompt")
                tokens = await client.post(self._url(target, "/tokenize"), json={"content": prompt})
                listed = tokens.json().get("tokens")
                return len(listed) if isinstance(listed, list) else None
            if engine not in (None, "vllm", "sglang"):
                return None
            answer = await client.post(self._url(target, "/tokenize"), json={"model": served, "messages": messages})
            counted = answer.json().get("count") if answer.status_code == 200 else None
            return counted if isinstance(counted, int) else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None

    # -- the request: clamp -----------------------------------------------------------------------
    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live or flow.request.method != "POST":
            return
        ex = exchange_of(flow)
        surface = surface_for(ex.path) if ex is not None else None
        if ex is None or surface not in ("chat", "responses", "messages"):
            return
        body = flow.request.raw_content or b""
        name = ex.extra.get("target")
        target = self.runtime.targets.get(name) if isinstance(name, str) else self.runtime.default_target
        # The router's one parse of the body noted its budget: most requests end here, unparsed again.
        budget = ex.extra.get(BUDGET_KEY)
        if target is None or budget is None:  # nothing to clamp: the engine isn't asked (its overflow has the numbers)
            return
        served = ex.served_model or ex.model or ""
        engine = self.runtime.engine_of(name)
        window = self.configured(ex) or await self.reported(target, served, engine)
        if window is None:
            return
        tokens, source = window
        ex.extra["window_hints"] = (tokens, None)
        if not might_not_fit(len(body), budget[1], tokens):
            return
        parsed = json_object(body)  # only a request that may not fit: its messages, to count
        messages = chat_messages(surface, parsed) if parsed is not None else None
        counted = await self.count(target, engine, messages, served) if messages is not None else None
        if counted is None:
            ex.flags.add("window_count_unavailable")
            return
        ex.extra["window_hints"] = (tokens, counted)
        if counted > tokens:  # the prompt alone can't fit: the overflow answer now, with the engine's count
            ex.flags.add(FLAG)
            answer_locally(flow, ex, context_overflow(surface, counted, tokens))
            return
        key, value = budget
        new = clamped(value, tokens, counted, self.runtime.settings.max_tokens_floor)
        if new is None:
            return
        flow.request.raw_content = splice(body, [Set((key,), new)])
        if "content-length" in flow.request.headers:
            flow.request.headers["content-length"] = str(len(flow.request.raw_content))
        left = tokens - counted
        floor = f", raised to the floor {new}" if new > left else ""
        reason = f"the {tokens}-token window ({source}) less the prompt's {counted} tokens (the engine's count) "
        ex.changes.append(Change("window", "clamp", f"$.{key}", value, new, reason + f"leaves {left}{floor}"))

    # -- the response: overflow errors, the models list -------------------------------------------
    def response(self, flow: http.HTTPFlow) -> None:
        ex = exchange_of(flow)
        response = flow.response
        if ex is None or response is None or response.stream or ex.tapfix_answered:
            return
        if response.status_code == 200 and flow.request.method == "GET":
            self._models_list(ex, response)
            return
        surface = surface_for(ex.path)
        if surface is None or response.status_code < 400:
            return
        body = ex.decoded_response if ex.decoded_response is not None else (response.raw_content or b"")
        rewritten = rewrite_body(surface, body, *ex.extra.get("window_hints", (None, None)))
        if rewritten is None:
            return
        answer, change = rewritten
        response.status_code = answer.status
        response.headers.pop("content-encoding", None)
        response.headers["content-type"] = "application/json"
        response.raw_content = answer.body
        if "content-length" in response.headers:
            response.headers["content-length"] = str(len(answer.body))
        ex.client_response = answer.body
        ex.changes.append(change)
        ex.flags.add(FLAG)
        name = ex.extra.get("target")
        for known in (self.runtime.windows, self.runtime.windows_unknown):
            for key in [k for k in known if k[0] == name]:
                del known[key]  # the window may have changed (or be told now): asked again on the next request

    def _models_list(self, ex: Exchange, response: http.Response) -> None:
        """Quick mode: the upstream's own list, each entry with `context_length` and `max_model_len`."""
        if not ex.path.split("?")[0].rstrip("/").endswith("/models") or ex.decoded_response is not None:
            return
        listing = json_object(response.raw_content or b"")
        data = listing.get("data") if listing is not None else None
        if listing is None or not isinstance(data, list):
            return
        added = 0
        for entry in data:
            if not isinstance(entry, dict) or "context_length" in entry:
                continue
            meta = entry.get("meta")
            window = self.runtime.settings.context_window or entry.get("max_model_len")
            window = window or (meta.get("n_ctx") if isinstance(meta, dict) else None)
            if isinstance(window, int) and window > 0:
                entry["context_length"] = window
                entry.setdefault("max_model_len", window)
                added += 1
        if not added:
            return
        body = orjson.dumps(listing)
        response.raw_content = body
        if "content-length" in response.headers:
            response.headers["content-length"] = str(len(body))
        ex.client_response = body
        ex.changes.append(
            Change("window", "inject", "$.data[*].context_length", None, added, "each model's context window")
        )
