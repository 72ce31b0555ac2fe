"""Window: knows each upstream's context window, clamps max_tokens to what it leaves, and turns an engine's
overflow error into the surface's standard one (the stream stage is armed by the stream owner,
addons/stream.py). The logic is in `tapfix.proxy.window`; the engine is asked over HTTP, never blocking the
event loop."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
import orjson
from mitmproxy import http
from tapfix.addons.runner.http import answer_locally
from tapfix.addons.runner.periodic import every
from tapfix.addons.runner.runtime import Runtime, exchange_of
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses
from tapfix.proxy.changes import Change
from tapfix.proxy.config.upstream import UpstreamTarget
from tapfix.proxy.errors import context_overflow, prompt_never_fits
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.jsonbody import PARSED_KEY, json_object, note_parse, shared_parse
from tapfix.proxy.jsonsplice import Set, splice
from tapfix.proxy.request.routing import resolve
from tapfix.proxy.surfaces import api_surface, surface_for
from tapfix.proxy.window.clamp import BUDGET_KEY, budget_of, clamped, might_not_fit, tokenize_request
from tapfix.proxy.window.counts import Counted, PromptCounts
from tapfix.proxy.window.overflow import RepeatedOverflows
from tapfix.proxy.window.rewrite import FLAG, rewrite_body
from tapfix.proxy.window.sources import engine_url, probes_for
from tapfix.proxy.window.usage import ADDED, ENGINES, ask_for_usage, request_change, with_usage

log = logging.getLogger("tapfix")
REPEATED_FLAG = "overflow_repeated"  # the same request overflowed again: answered so the agent stops
ASK_TIMEOUT_S = 10.0
# An engine that didn't tell its window is asked again only after this long (issue 34: not once per request,
# which cost every request of the agents' path an upstream round trip before it was sent).
UNKNOWN_FOR_S = 60.0
# Windows are read at start and again this often (an engine restarted with another `-c` or `num_ctx`, an Ollama
# model loaded with another context), so a request seldom waits for one.
REFRESH_S = 300.0


class Window:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._client: httpx.AsyncClient | None = None
        self._task: asyncio.Task[None] | None = None
        self._answers: dict[tuple[str, str], tuple[float, Any]] = {}  # (upstream, path) → (kept until, JSON)
        self._shown: dict[tuple[str, str], str] = {}  # what the log last said of each model's window
        self._asking: dict[tuple[str, str], asyncio.Future[Any]] = {}  # GETs in flight
        self._settling: set[tuple[str, str]] = set()  # models whose window is being read again after an answer
        self._pending: set[asyncio.Task[None]] = set()
        self.repeated = RepeatedOverflows()  # prompts answered as overflowing: the same again ends the cycle
        self.counts = PromptCounts()  # llama.cpp's counts of recent prompts: a next turn tokenizes its new part

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=ASK_TIMEOUT_S, verify=not self.runtime.settings.insecure)
        return self._client

    def running(self) -> None:
        if self.runtime.targets and self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                every(REFRESH_S, self.read_all, "reading the context windows")
            )

    async def done(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for task in list(self._pending):
            task.cancel()
        if self._client is not None:
            await self._client.aclose()

    async def read_all(self) -> None:
        """Every known model's window, read again from its engine and logged: the config's models, or in quick
        mode what the upstream's `/v1/models` lists."""
        self._answers.clear()  # this round asks afresh
        config = getattr(self.runtime.policy, "config", None)
        pairs: list[tuple[str, str]] = []
        if config is not None and not config.is_quick:
            pairs = [
                (m.upstream, m.upstream_model)
                for m in config.models.values()
                if m.upstream_model != "*" and not m.context_window  # a configured window wins: nothing to ask
            ]
        elif not self.runtime.settings.context_window:
            for name, listed in self.runtime.targets.items():
                engine = self.runtime.engine_of(name)  # an engine not named (or that tells no window) isn't asked
                if engine is not None and probes_for(engine):
                    pairs += [(name, served) for served in await self._served(listed)]
        for name, served in dict.fromkeys(pairs):
            target = self.runtime.targets.get(name)
            if target is None:
                continue
            await self.refresh(target, served)

    async def refresh(self, target: UpstreamTarget, served: str) -> None:
        """Read one model's window again, and log it when it is new or changed."""
        key = (target.name, served)
        found = await self.read(target, served, self.runtime.engine_of(target.name)) or self.runtime.windows.get(
            key
        )  # an engine that didn't answer this round keeps the window it told before
        shown = f"{found[0]:,} tokens ({found[1]})" if found else "unknown (the engine doesn't say)"
        if self._shown.get(key) != shown:
            self._shown[key] = shown
            log.info("window of %s on %s: %s", served or "the served model", target.name, shown)

    def _settle(self, ex: Exchange) -> None:
        """An answered request has loaded its model: a window read from Ollama's `/api/show` (the model's own
        maximum, an upper bound, when it wasn't loaded) is read again in the background, now that `/api/ps`
        can say the one it runs with."""
        name = ex.extra.get("target")
        target = self.runtime.targets.get(name) if isinstance(name, str) else self.runtime.default_target
        served = ex.served_model or ex.model or ""
        if target is None or (target.name, served) in self._settling:
            return
        cached = self.runtime.windows.get((target.name, served))
        if cached is None or cached[1] != "POST /api/show":
            return
        self._settling.add((target.name, served))
        self._answers.pop((target.name, "/api/ps"), None)

        async def settle() -> None:
            try:
                await self.refresh(target, served)
            finally:
                self._settling.discard((target.name, served))

        task = asyncio.get_running_loop().create_task(settle())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _served(self, target: UpstreamTarget) -> list[str]:
        listing = await self._get(target, "/v1/models")
        data = listing.get("data") if isinstance(listing, dict) else None
        return [e["id"] for e in data if isinstance(e, dict) and isinstance(e.get("id"), str)] if data else []

    async def _get(self, target: UpstreamTarget, path: str) -> Any:
        """A GET answer's JSON (None: no answer), kept a while: a listing read at start, or for one model,
        answers the next model's question too, and a question in flight is awaited, not asked again (an
        upstream is not asked the same twice in a row: the start's read and a first request meet here)."""
        key = (target.name, path)
        kept = self._answers.get(key)
        if kept is not None and kept[0] > time.monotonic():
            return kept[1]
        asking = self._asking.get(key)
        if asking is None:
            asking = self._asking[key] = asyncio.ensure_future(self._ask(target, path))
            asking.add_done_callback(lambda _: self._asking.pop(key, None))
        return await asyncio.shield(asking)

    async def _ask(self, target: UpstreamTarget, path: str) -> Any:
        try:
            answer = await self.client().get(engine_url(target.url, path))
            found = answer.json() if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            found = None
        self._answers[(target.name, path)] = (time.monotonic() + UNKNOWN_FOR_S, found)
        return found

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
        return await self.read(target, served, engine)

    async def read(self, target: UpstreamTarget, served: str, engine: str | None) -> tuple[int, str] | None:
        """Ask the engine (`window/sources.py` says where); what it says is cached, silence remembered a while."""
        key = (target.name, served)
        for probe in probes_for(engine):
            if probe.post:
                try:
                    answer = await self.client().post(engine_url(target.url, probe.path), json={"model": served})
                    found = probe.read(answer.json(), served) if answer.status_code == 200 else None
                except (httpx.HTTPError, ValueError):
                    found = None
            else:
                found = probe.read(await self._get(target, probe.path), served)
            if found:
                self.runtime.windows[key] = (found, probe.label)
                self.runtime.windows_unknown.pop(key, None)
                return self.runtime.windows[key]
        self.runtime.windows_unknown[key] = time.monotonic() + UNKNOWN_FOR_S
        return None

    async def count(
        self, target: UpstreamTarget, engine: str | None, request: dict[str, Any], served: str, whole: bool = False
    ) -> Counted | None:
        """The prompt's tokens by the engine's own tokenizer, chat template applied: vLLM and SGLang
        `POST /tokenize` with the messages and tools (`tokenize_request`); llama.cpp `/apply-template` then
        `/tokenize`, of only what follows a prompt counted before (`whole`: of all of it). None: it can't say."""
        client = self.client()
        try:
            if engine == "llamacpp":
                applied = await client.post(engine_url(target.url, "/apply-template"), json=request)
                prompt = applied.json().get("prompt")
                if not isinstance(prompt, str):
                    return None
                model = (target.name, served)
                earlier = None if whole else self.counts.known(model, prompt)
                if earlier is not None and earlier[0] == prompt:
                    return earlier[1]
                rest = prompt[len(earlier[0]) :] if earlier is not None else prompt
                tokens = await client.post(engine_url(target.url, "/tokenize"), json={"content": rest})
                listed = tokens.json().get("tokens")
                if not isinstance(listed, list):
                    return None
                counted = Counted(len(listed) + (earlier[1].tokens if earlier else 0), exact=earlier is None)
                self.counts.remember(model, prompt, counted)
                return counted
            if engine not in (None, "vllm", "sglang"):
                return None
            answer = await client.post(engine_url(target.url, "/tokenize"), json={"model": served, **request})
            found = answer.json().get("count") if answer.status_code == 200 else None
            return Counted(found, exact=True) if isinstance(found, int) else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None

    # -- the request: clamp -----------------------------------------------------------------------
    async def request(self, flow: http.HTTPFlow) -> None:
        ex = exchange_of(flow)
        if ex is None:
            return
        try:
            await self._request(flow, ex)
        finally:
            ex.extra.pop(PARSED_KEY, None)  # the request side's last reader of the shared parse: its memory goes

    async def _request(self, flow: http.HTTPFlow, ex: Exchange) -> None:
        if flow.response or flow.error or not flow.live or flow.request.method != "POST":
            return
        surface = surface_for(ex.path)
        api = api_surface(surface)
        if not api.turns:
            return
        body = flow.request.raw_content or b""
        name = ex.extra.get("target")
        target = self.runtime.targets.get(name) if isinstance(name, str) else self.runtime.default_target
        engine = self.runtime.engine_of(name)
        if api.asks_stream_usage and ex.stream and engine in ENGINES:
            parsed = shared_parse(ex.extra, body)
            asked = ask_for_usage(body, parsed)
            if asked is not None and parsed is not None:
                body = self._forward(flow, asked[0])
                note_parse(ex.extra, body, with_usage(parsed))
                ex.extra[ADDED] = True
                ex.changes.append(request_change(asked[1]))
        if target is None:
            return
        served = ex.served_model or ex.model or ""
        # The router's one parse of the body noted its budget (else the shared parse has it).
        if BUDGET_KEY in ex.extra:
            budget = ex.extra[BUDGET_KEY]
        else:
            parsed = shared_parse(ex.extra, body)
            budget = budget_of(surface, parsed) if parsed is not None else None
        # Without an output budget the engine isn't asked now (its own overflow error has the numbers): the
        # window read at start or since, if any, is what the truncation check reads.
        known = self.configured(ex) or self.runtime.windows.get((target.name, served))
        window = known if budget is None else known or await self.reported(target, served, engine)
        if window is not None:
            ex.extra["window_hints"] = (window[0], None)
        if budget is None or window is None:
            return
        tokens, source = window
        if not might_not_fit(len(body), budget[1], tokens):
            return
        parsed = shared_parse(ex.extra, body)
        request = tokenize_request(surface, parsed) if parsed is not None else None
        found = await self.count(target, engine, request, served) if request is not None else None
        if request is not None and found is not None and not found.exact and found.tokens > tokens:
            found = await self.count(target, engine, request, served, whole=True)  # an overflow answer: a whole count
        if found is None:
            ex.flags.add("window_count_unavailable")
            return
        counted = found.tokens
        ex.extra["window_hints"] = (tokens, counted)
        if counted > tokens:  # the prompt alone can't fit: the overflow answer now, with the engine's count
            ex.flags.add(FLAG)
            if self.repeated.again(f"{ex.client_addr} {ex.user_agent}", body):  # compacting didn't shorten it
                ex.flags.add(REPEATED_FLAG)
                answer_locally(flow, ex, prompt_never_fits(surface, counted, tokens))
                return
            answer_locally(flow, ex, context_overflow(surface, counted, tokens))
            return
        key, value = budget
        new = clamped(value, tokens, counted, self.runtime.settings.max_tokens_floor)
        if new is None:
            return
        self._forward(flow, splice(body, [Set((key,), new)], parsed))
        left = tokens - counted
        floor = f", raised to the floor {new}" if new > left else ""
        reason = f"the {tokens}-token window ({source}) less the prompt's {counted} tokens (the engine's count) "
        ex.changes.append(Change("window", "clamp", f"$.{key}", value, new, reason + f"leaves {left}{floor}"))

    @staticmethod
    def _forward(flow: http.HTTPFlow, body: bytes) -> bytes:
        flow.request.raw_content = body
        if "content-length" in flow.request.headers:
            flow.request.headers["content-length"] = str(len(body))
        return body

    # -- the response: overflow errors, the models list -------------------------------------------
    def response(self, flow: http.HTTPFlow) -> None:
        ex = exchange_of(flow)
        response = flow.response
        if ex is not None and response is not None and response.status_code == 200 and not ex.tapfix_answered:
            self._settle(ex)
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
        for kept in [k for k in self._answers if k[0] == name]:
            del self._answers[kept]

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
