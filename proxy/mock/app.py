"""The Starlette app of `tapfix mock`: routes, per-process counters, and request dispatch.

Every response is a `wire.Plan` of pre-built bytes. Nothing is recorded and nothing is logged per
request: the mock must never be the bottleneck of a benchmark or the noise in a test's output.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route
from tapfix.proxy.mock.agent_script import image_urls, text_of
from tapfix.proxy.mock.behaviours import Ids, apply_faults, make_reply, max_tokens_of
from tapfix.proxy.mock.cases import Case, load_case
from tapfix.proxy.mock.chat import (
    ChunkBuilder,
    completion_body,
    completion_events,
    dumps,
    error_body,
    invalid_json_body,
    missing_field_body,
    models_body,
    reply_body,
    stream_events,
    usage_object,
)
from tapfix.proxy.mock.continuation import PLAIN, Continuation, ContinuationError, continuation_of, conversation_key
from tapfix.proxy.mock.jsonish import arr, obj
from tapfix.proxy.mock.messages import messages_body, messages_error, messages_events
from tapfix.proxy.mock.options import DEFAULT_MODEL, MockOptions, RecordedResponse
from tapfix.proxy.mock.responses import responses_body, responses_error, responses_events
from tapfix.proxy.mock.scenario import RequestFacts, Rule, Scenario, load_scenario
from tapfix.proxy.mock.surface_script import (
    EventedSurface,
    break_pieces,
    chat_from_messages,
    chat_from_responses,
    from_case,
    from_reply,
    last_role,
)
from tapfix.proxy.mock.window import refusal, tokenize_body
from tapfix.proxy.mock.wire import SSE_HEADERS, Op, Plan, Send, Sleep, compress, json_headers, paced, split_body

_ATTEMPT_MEMORY = 100_000
_HOP_BY_HOP = {"content-length", "transfer-encoding", "connection", "keep-alive"}
ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]


@dataclass
class MockState:
    """What survives between requests: the loaded cases and scenario, and the counters."""

    opts: MockOptions
    scenario: Scenario | None = None
    cases: dict[str, Case] = field(default_factory=dict)
    nth: int = 0
    round_robin: int = 0
    attempts: OrderedDict[str, int] = field(default_factory=OrderedDict)

    @classmethod
    def load(cls, opts: MockOptions) -> MockState:
        state = cls(opts)
        if opts.scenario is not None:
            state.scenario = load_scenario(opts.scenario)
        for path in opts.cases:
            case = load_case(path)
            state.cases[case.name] = case
        return state

    @property
    def models(self) -> list[str]:
        base = (self.scenario.models if self.scenario and self.scenario.models else None) or self.opts.models
        ids = list(base or [DEFAULT_MODEL])
        return ids + [name for name in self.cases if name not in ids]

    def count(self, conversation: str) -> tuple[int, int]:
        """(nth generation request, attempt number of this conversation: see `conversation_key`)."""
        self.nth += 1
        attempt = self.attempts.pop(conversation, 0) + 1
        self.attempts[conversation] = attempt
        if len(self.attempts) > _ATTEMPT_MEMORY:
            self.attempts.popitem(last=False)
        return self.nth, attempt

    def case_for(self, model: str | None) -> Case | None:
        if not self.cases:
            return None
        if model in self.cases:
            return self.cases[model]
        names = list(self.cases)
        case = self.cases[names[self.round_robin % len(names)]]
        self.round_robin += 1
        return case


def create_app(opts: MockOptions) -> Starlette:
    """The mock as an ASGI app; raises ValueError (ScenarioError) at once on a bad scenario or case."""
    state = MockState.load(opts)
    if opts.recorded is not None:
        recorded = opts.recorded

        async def replay(request: Request) -> Plan:
            await request.body()
            return _replay_plan(recorded, opts.fast)

        return Starlette(routes=[Route("/{path:path}", replay, methods=ALL_METHODS)])

    async def health(request: Request) -> Plan:
        return _json(200, b"{}")

    async def models(request: Request) -> Plan:
        rule = _match(state, request.url.path, None, 0, 0)
        if rule is not None and rule.do == "http_error":
            return _http_error(rule)
        window = state.opts.context_window
        return _json(200, models_body(state.models, created=1_760_000_000, max_model_len=window or 32768))

    async def tokenize(request: Request) -> Plan:
        req = obj(orjson.loads(await request.body() or b"{}"))
        return _json(200, tokenize_body(req, state.opts.context_window or 32768))

    async def chat(request: Request) -> Plan:
        return await _generate(state, request, chat=True)

    async def completions(request: Request) -> Plan:
        return await _generate(state, request, chat=False)

    async def responses(request: Request) -> Plan:
        return await _generate_surface(state, request, "responses")

    async def messages(request: Request) -> Plan:
        return await _generate_surface(state, request, "messages")

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
    ]
    return Starlette(routes=routes)


def _match(
    state: MockState,
    path: str,
    req: dict[str, Any] | None,
    nth: int,
    attempt: int,
    role: str | None = None,
) -> Rule | None:
    if state.scenario is None:
        return None
    req = req or {}
    messages = arr(req.get("messages"))
    facts = RequestFacts(
        nth=nth,
        attempt=attempt,
        path=path,
        model=req.get("model") if isinstance(req.get("model"), str) else None,
        has_tools=bool(req.get("tools")),
        has_images=any(isinstance(m, dict) and image_urls(m.get("content")) for m in messages),
        stream=bool(req.get("stream")),
        last_role=role,
    )
    return state.scenario.match(facts)


async def _generate(state: MockState, request: Request, chat: bool) -> Plan:
    body = await request.body()
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError:
        return _json(400, invalid_json_body(body))
    if not isinstance(req, dict):
        return _json(400, error_body("The request body must be a JSON object", 400))
    if chat and not isinstance(req.get("messages"), list):
        return _json(400, missing_field_body("messages", len(req)))
    if chat and state.opts.context_window and (refused := refusal(req, "chat", state.opts.context_window)):
        return _json(400, refused)
    try:
        cont = continuation_of(req) if chat else PLAIN
    except ContinuationError as e:
        return _json(400, error_body(str(e), 400))
    ids = Ids.of(body)
    nth, attempt = state.count(conversation_key(req, "chat" if chat else "completions"))
    role = last_role(cont.script_request(req), "chat" if chat else "completions")  # a prefix is the reply
    rule = _match(state, request.url.path, req, nth, attempt, role)
    requested = req.get("model") if isinstance(req.get("model"), str) else None
    if state.scenario and state.scenario.strict_models and requested not in state.models:
        return _json(404, error_body(f"The model `{requested}` does not exist.", 404, param="model"))
    plan = _respond(state, req, rule, ids, chat, requested or state.models[0], cont)
    params = rule.params if rule else {}
    delay_ms = float(params.get("ms", 0) if rule and rule.do == "delay_ms" else params.get("delay_ms", 0))
    plan.before_headers = delay_ms / 1000
    return _compressed(plan, params)


def _respond(
    state: MockState,
    req: dict[str, Any],
    rule: Rule | None,
    ids: Ids,
    chat: bool,
    model: str,
    cont: Continuation = PLAIN,
) -> Plan:
    if rule is not None and rule.do == "http_error":
        return _http_error(rule)
    if rule is not None and rule.do == "garbage":
        junk = str(rule.params.get("body", "<html><body><h1>502 Bad Gateway</h1></body></html>\n\x00\x01")).encode()
        content_type = str(rule.params.get("content_type", "text/event-stream; charset=utf-8")).encode()
        ops = _stalled([Send(junk)], rule.params)
        return Plan(int(rule.params.get("status", 200)), [(b"content-type", content_type)], ops)
    stream = bool(req.get("stream"))
    params = rule.params if rule else {}
    delay = float(params.get("chunk_delay_ms", state.opts.chunk_delay_ms)) / 1000
    case = rule.case if rule is not None and rule.do == "serve_case" else (state.case_for(model) if chat else None)
    builder = ChunkBuilder(ids.chat_id, ids.created, model) if chat else None
    if case is not None:
        if not stream:
            status, data = case.non_stream()
            return Plan(status, _headers(json_headers(data)), apply_faults([Send(data)], rule, builder, False))
        return Plan(200, _headers(SSE_HEADERS), apply_faults(paced(case.events, delay), rule, builder, True))
    if not chat:
        req = {**req, "messages": [{"role": "user", "content": _prompt_of(req.get("prompt"))}]}
        req.pop("tools", None)
    reply = make_reply(req, rule, ids, cont).tokenize(max_tokens_of(req))
    if rule is not None and rule.do == "break_tool_call":
        reply = break_pieces(reply, str(rule.params.get("mode", "truncate")))
    prompt_tokens = max(1, len(orjson.dumps(req.get("messages"))) // 4)
    options = obj(req.get("stream_options"))
    include_usage = bool(options.get("include_usage"))
    if chat and builder is not None:
        if stream:
            events = stream_events(reply, builder, prompt_tokens, include_usage, cont.role, cont.echo)
        else:
            data = reply_body(reply, ids.chat_id, ids.created, model, prompt_tokens, cont.role, cont.echo)
    else:
        usage = usage_object(prompt_tokens, reply.completion_tokens)
        if stream:
            events = completion_events(
                reply.content_pieces,
                ids.completion_id,
                ids.created,
                model,
                reply.finish_reason,
                usage if include_usage else None,
            )
        else:
            data = completion_body(reply.content, ids.completion_id, ids.created, model, reply.finish_reason, usage)
    if stream:
        return Plan(200, _headers(SSE_HEADERS), apply_faults(paced(events, delay), rule, builder, True))
    return Plan(200, _headers(json_headers(data)), apply_faults([Send(data)], rule, builder, False))


async def _generate_surface(state: MockState, request: Request, surface: EventedSurface) -> Plan:
    """/v1/responses and /v1/messages: the same script and scenario rules, drawn in that format."""
    error = responses_error if surface == "responses" else messages_error
    body = await request.body()
    try:
        req = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        return _json(400, error(f"Invalid JSON body: {e}", 400))
    if not isinstance(req, dict):
        return _json(400, error("The request body must be a JSON object", 400))
    field_name = "input" if surface == "responses" else "messages"
    if req.get(field_name) is None:
        return _json(400, error(f"Field required: {field_name}", 400))
    if state.opts.context_window and (refused := refusal(req, surface, state.opts.context_window)):
        return _json(400, refused)
    chat = (chat_from_responses if surface == "responses" else chat_from_messages)(req)
    chat["stream"] = bool(req.get("stream"))
    ids = Ids.of(body)
    nth, attempt = state.count(conversation_key(req, surface))
    rule = _match(state, request.url.path, chat, nth, attempt, last_role(req, surface))
    given = req.get("model")
    model = given if isinstance(given, str) else state.models[0]
    if state.scenario and state.scenario.strict_models and model not in state.models:
        return _json(404, error(f"The model `{model}` does not exist.", 404))
    if rule is not None and rule.do in ("http_error", "garbage"):
        return _compressed(_respond(state, chat, rule, ids, True, model), rule.params)
    case = rule.case if rule is not None and rule.do == "serve_case" else state.case_for(model)
    if case is not None:
        script = from_case(case.data.get("stream", []))
    else:
        reply = make_reply(chat, rule, ids).tokenize(max_tokens_of(chat))
        if rule is not None and rule.do == "break_tool_call":
            reply = break_pieces(reply, str(rule.params.get("mode", "truncate")))
        script = from_reply(reply)
    prompt_tokens = max(1, len(orjson.dumps(chat["messages"])) // 4)
    stream = chat["stream"]
    if surface == "responses":
        args = (script, req, ids.digest, ids.created, model, prompt_tokens)
        events = responses_events(*args) if stream else []
        data = b"" if stream else responses_body(*args)
    else:
        events = messages_events(script, ids.digest, model, prompt_tokens) if stream else []
        data = b"" if stream else messages_body(script, ids.digest, model, prompt_tokens)
    if case is not None and case.error is not None:
        message = str(case.error.get("message") or "upstream error")
        if not stream:
            return _json(500, error(message, 500))
        events = events[: -1 if surface == "responses" else -2] + [_surface_error_event(surface, message)]
    params = rule.params if rule else {}
    delay = float(params.get("chunk_delay_ms", state.opts.chunk_delay_ms)) / 1000
    if stream:
        plan = Plan(200, _headers(SSE_HEADERS), apply_faults(paced(events, delay), rule, None, True))
    else:
        plan = Plan(200, _headers(json_headers(data)), apply_faults([Send(data)], rule, None, False))
    delay_ms = float(params.get("ms", 0) if rule and rule.do == "delay_ms" else params.get("delay_ms", 0))
    plan.before_headers = delay_ms / 1000
    return _compressed(plan, params)


def _compressed(plan: Plan, params: dict[str, Any]) -> Plan:
    """A rule's `compress`: the reply in that Content-Encoding whatever Accept-Encoding said."""
    if "compress" not in params:
        return plan
    return compress(plan, str(params["compress"]), lie=bool(params.get("compress_lie")))


def _surface_error_event(surface: EventedSurface, message: str) -> bytes:
    data: dict[str, Any]
    if surface == "responses":
        data = {"type": "error", "code": "server_error", "message": message, "param": None}
    else:
        data = {"type": "error", "error": {"type": "api_error", "message": message}}
    return b"event: error\ndata: " + dumps(data) + b"\n\n"


def _prompt_of(prompt: Any) -> str:
    if isinstance(prompt, list):
        return " ".join(p for p in prompt if isinstance(p, str))
    return prompt if isinstance(prompt, str) else text_of(prompt)


def _headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """vLLM runs under uvicorn: `date` and `server` come first (uvicorn's own are switched off)."""
    return [(b"date", formatdate(usegmt=True).encode()), (b"server", b"uvicorn"), *headers]


def _json(status: int, data: bytes) -> Plan:
    return Plan(status, _headers(json_headers(data)), [Send(data)])


def _http_error(rule: Rule) -> Plan:
    status = int(rule.params.get("status", 500))
    body = rule.params.get("body")
    if body is None:
        data = error_body("Internal server error" if status >= 500 else "Bad request", status)
    elif isinstance(body, str):
        data = body.encode()
    else:
        data = dumps(body)
    headers = [(k.lower().encode(), v.encode()) for k, v in rule.params.get("headers", {}).items()]
    return Plan(status, _headers(json_headers(data)) + headers, _stalled([Send(data)], rule.params))


def _stalled(ops: list[Op], params: dict[str, Any]) -> list[Op]:
    """`stall_s` on an error or garbage reply: its body's first half, that long a pause, then the rest
    (an upstream that stalls while it answers with an error)."""
    seconds = float(params.get("stall_s", 0))
    if seconds <= 0:
        return ops
    first, second = split_body(b"".join(op.data for op in ops if isinstance(op, Send)))
    return [first, Sleep(seconds), second]


def _replay_plan(recorded: RecordedResponse, fast: bool) -> Plan:
    """The captured bytes at their captured offsets (a recorded reset shows as an early end)."""
    headers = [
        (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in recorded.headers if k.lower() not in _HOP_BY_HOP
    ]
    return _TimedPlan(
        recorded.status,
        headers,
        chunks=[] if fast else recorded.chunks,
        ops=[Send(data) for _, data in recorded.chunks] if fast else [],
    )


class _TimedPlan(Plan):
    """Sends each chunk at its recorded offset from the start of the request, not after a fixed gap."""

    def __init__(
        self,
        status: int,
        headers: list[tuple[bytes, bytes]],
        chunks: list[tuple[float, bytes]],
        ops: list[Any],
    ) -> None:
        super().__init__(status, headers, ops)
        self.chunks = chunks
        self.start = time.monotonic()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not self.chunks:
            return await super().__call__(scope, receive, send)
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        for offset, data in self.chunks:
            wait = self.start + offset - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
