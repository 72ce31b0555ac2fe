"""One exchange summed up for telemetry: what spans, OTel metrics and Prometheus all read.

Built once per exchange on the writer thread (`TurnFanout` in `observe.py` calls `turn_from` and
hands the same `Turn` to every sink), from what the writer already has: the stored row (flags, first
token, the engine's error), the assembled answer (finish reasons, usage) and the exchange itself
(ids, times, changes, chunk timings). The only bytes read again are the forwarded request, for its
parameters, and the head of the answer, for the model and id the upstream reported.
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson
from tapfix.proxy.assemble import Assembled
from tapfix.proxy.assemble.usage import usage_counts
from tapfix.proxy.changes import Change
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.request.reasoning import detect
from tapfix.proxy.request.reasoning_replay import REPLAY_MISSED, replay_counts
from tapfix.proxy.store.redact import secret_values
from tapfix.proxy.store.writer import Written
from tapfix.proxy.surfaces import api_surface, surface_for
from tapfix.proxy.telemetry import semconv as sc
from tapfix.proxy.telemetry.answer import response_identity
from tapfix.proxy.telemetry.content import TurnContent, turn_content

UNRECOVERABLE_FLAG = "toolcall_unrecoverable"
RESET_FLAGS = frozenset({"upstream_reset", "stream_incomplete"})
# Tool-call-stage change kinds that record something else than a repair (see `_repairs`).
NOT_REPAIRS = frozenset({"upstream_error", "inject", "override", "drop", "regenerate", "skip"})
# Request fields as forwarded -> the span attribute that names them (first present wins).
_PARAMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (sc.GEN_AI_REQUEST_MAX_TOKENS, ("max_completion_tokens", "max_tokens", "max_output_tokens")),
    (sc.GEN_AI_REQUEST_TEMPERATURE, ("temperature",)),
    (sc.GEN_AI_REQUEST_TOP_P, ("top_p",)),
    (sc.GEN_AI_REQUEST_TOP_K, ("top_k",)),
    (sc.GEN_AI_REQUEST_FREQUENCY_PENALTY, ("frequency_penalty",)),
    (sc.GEN_AI_REQUEST_PRESENCE_PENALTY, ("presence_penalty",)),
    (sc.GEN_AI_REQUEST_SEED, ("seed",)),
    (sc.GEN_AI_REQUEST_STOP_SEQUENCES, ("stop", "stop_sequences")),
    (sc.GEN_AI_REQUEST_CHOICE_COUNT, ("n",)),
    (sc.GEN_AI_REQUEST_ENCODING_FORMATS, ("encoding_format",)),
)


@dataclass(frozen=True, slots=True)
class Turn:
    capture_id: str
    outcome: str
    surface: str  # tapfix.proxy.surfaces name, or "other"
    operation: str  # gen_ai.operation.name ("chat", "text_completion", "embeddings", ...), or "other"
    provider: str | None  # the engine, else the provider whose API the surface is (`provider_of`)
    upstream: str | None  # the configured upstream's name
    public_model: str | None  # as the client asked
    request_model: str | None  # as forwarded
    response_model: str | None
    response_id: str | None
    finish_reasons: tuple[str, ...]
    input_tokens: int | None
    output_tokens: int | None
    reasoning_tokens: int | None
    cached_tokens: int | None
    started_at: float
    duration_s: float | None
    time_to_first_chunk_s: float | None
    chunk_intervals_s: tuple[float, ...]  # seconds between consecutive upstream chunks
    stream: bool
    status: int | None
    status_class: str  # "2xx".."5xx", or "none" (no answer)
    error_type: str | None  # set iff the exchange is an error (span status ERROR)
    repairs: dict[str, int]  # tool-call repairs by kind
    unrecoverable: bool
    attempt: int
    attempt_of: str | None
    flags: frozenset[str]
    changes: tuple[Change, ...]
    trace_id: str | None
    span_id: str | None
    parent_span_id: str | None
    request_params: dict[str, Any]  # gen_ai.request.* values as forwarded, keyed by attribute name
    # Beyond the contract's fields:
    session_id: str | None = None
    store_bodies: bool = True  # False: `--no-bodies`, no content may leave either
    content: TurnContent | None = None  # only when TurnContext.capture_content and bodies are stored
    server_address: str | None = None
    server_port: int | None = None
    cache_write_tokens: int | None = None
    secrets: tuple[str, ...] = ()  # credential values of its headers, redacted from content (content only)
    reasoning_replay: dict[str, int] = field(default_factory=dict)  # issue 36: resent turns, replayed / missed
    request_changes: dict[str, int] = field(default_factory=dict)  # request-stage changes by kind
    prefix_break_cause: str | None = None  # where its prompt stopped extending its thread's last (issue 36)

    @property
    def is_genai(self) -> bool:
        """An inference or embeddings call (the GenAI spans and metrics are about these)."""
        return self.operation != "other"


@dataclass(frozen=True)
class TurnContext:
    """What the process knows beyond the exchange."""

    engine_of: Callable[[str | None], str | None]
    capture_content: bool = False  # OTLP export asks for prompts and answers (content mode not NO_CONTENT)
    # Parse the forwarded request for the span's request model and parameters. Only spans read them: with
    # export off the metrics alone need a Turn, and parsing every body (up to MBs) on the writer thread
    # would be work for nothing (`request_params` then holds only what the exchange knows, `request_model`
    # is the routed id).
    request_body: bool = True


def turn_from(written: Written, context: TurnContext) -> Turn:
    """The exchange's summary; never raises for an odd body (unparseable parts are left None)."""
    ex, row, assembled = written.exchange, written.row or {}, written.assembled
    surface = surface_for(ex.path) or "other"
    operation = _operation(surface, ex.path)
    body = (
        _json_object(ex.forwarded if ex.forwarded is not None else ex.readable_request())
        if context.request_body
        else {}
    )
    flags = frozenset(_row_flags(row) or ex.flags)
    identity = response_identity(ex) if ex.status is not None else (None, None)
    usage = usage_counts(assembled.usage if assembled is not None else None)
    repairs = _repairs(ex.changes)
    upstream = ex.extra.get("target")
    status = ex.status
    address, port = _server(ex.upstream_url)
    secrets = None  # only content leaving the host needs them
    if context.capture_content and ex.store_bodies:
        secrets = tuple(secret_values([*ex.request_headers, *(ex.forwarded_headers or ())]))
    return Turn(
        capture_id=ex.id,
        outcome=written.outcome,
        surface=surface,
        operation=operation,
        provider=provider_of(context.engine_of(upstream), surface, operation),
        upstream=upstream,
        public_model=ex.model,
        request_model=_request_model(ex, body),
        response_model=identity[0],
        response_id=identity[1],
        finish_reasons=_finish_reasons(assembled),
        input_tokens=usage.input,
        output_tokens=usage.output,
        reasoning_tokens=usage.reasoning,
        cached_tokens=usage.cached,
        started_at=ex.started_at,
        duration_s=None if ex.ended_at is None else max(ex.ended_at - ex.mark, 0.0),
        time_to_first_chunk_s=_first_chunk(ex, row),
        chunk_intervals_s=_intervals(ex.chunk_times) if ex.stream else (),
        stream=ex.stream,
        status=status,
        status_class="none" if status is None else f"{status // 100}xx",
        error_type=_error_type(ex, row, flags),
        repairs=repairs,
        unrecoverable=UNRECOVERABLE_FLAG in flags,
        attempt=ex.attempt if ex.attempt_of is not None else 1,
        attempt_of=ex.attempt_of,
        flags=flags,
        changes=tuple(ex.changes),
        trace_id=ex.trace_id,
        span_id=ex.span_id,
        parent_span_id=ex.parent_span_id,
        request_params=_request_params(body, ex.stream),
        session_id=row.get("session_id"),
        store_bodies=ex.store_bodies,
        reasoning_replay=replay_counts(ex.changes, ex.extra.get(REPLAY_MISSED, 0)),
        content=turn_content(surface, body, assembled, secrets) if secrets is not None else None,
        server_address=address,
        server_port=port,
        cache_write_tokens=usage.cache_write,
        secrets=secrets or (),
        request_changes=_request_changes(ex.changes),
        prefix_break_cause=_prefix_cause(ex.prefix_break),
    )


def provider_of(engine: str | None, surface: str, operation: str = "other") -> str | None:
    """`gen_ai.provider.name`, which the conventions require: the engine when tapfix knows it (`--engine`,
    an upstream's `engine`), else the provider whose API the client speaks, named as the conventions
    list it (Messages is Anthropic's API, the others OpenAI's). The attribute is the instrumentation's
    best knowledge, which the conventions allow to differ from the real upstream behind a proxy."""
    if engine:
        return engine
    if operation == sc.OP_EMBEDDINGS:
        return "openai"  # /v1/embeddings is OpenAI's API
    return api_surface(surface).provider


def _operation(surface: str, path: str) -> str:
    if (api := api_surface(surface)).inference:
        return api.operation
    if path.split("?", 1)[0].rstrip("/").endswith("embeddings"):
        return sc.OP_EMBEDDINGS
    return "other"


def _json_object(body: bytes | None) -> dict[str, Any]:
    if not body:
        return {}
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _row_flags(row: dict[str, Any]) -> list[str]:
    """The stored flags: the exchange's own plus those the writer judged from the answer."""
    text = row.get("flags")
    if not isinstance(text, str):
        return []
    try:
        flags = orjson.loads(text)
    except orjson.JSONDecodeError:
        return []
    return [f for f in flags if isinstance(f, str)] if isinstance(flags, list) else []


def _request_model(ex: Exchange, body: dict[str, Any]) -> str | None:
    model = body.get("model")
    if isinstance(model, str) and model:
        return model
    return ex.served_model or ex.model


def _request_params(body: dict[str, Any], stream: bool) -> dict[str, Any]:
    """The gen_ai.request.* values of the body as forwarded, as attribute-ready values."""
    params: dict[str, Any] = {sc.GEN_AI_REQUEST_STREAM: stream}
    for attribute, keys in _PARAMS:
        for key in keys:
            value = _attribute_value(body.get(key))
            if value is not None:
                params[attribute] = value
                break
    if params.get(sc.GEN_AI_REQUEST_CHOICE_COUNT) == 1:
        del params[sc.GEN_AI_REQUEST_CHOICE_COUNT]  # the conventions set it only when != 1
    level = _reasoning_level(body)
    if level is not None:
        params[sc.GEN_AI_REQUEST_REASONING_LEVEL] = level
    return params


def _attribute_value(value: Any) -> Any:
    """An OTel attribute value (bool, int, float, str, or a list of str), or None."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def _reasoning_level(body: dict[str, Any]) -> str | None:
    """The reasoning knob as it went upstream, in its own words ("high", "true", a budget's JSON)."""
    found = detect(body)
    if not found:
        return None
    value = found[0].value
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def _finish_reasons(assembled: Assembled | None) -> tuple[str, ...]:
    if assembled is None:
        return ()
    choices = assembled.choices or [assembled]
    return tuple(c.finish_reason for c in choices if c.finish_reason)


def _first_chunk(ex: Exchange, row: dict[str, Any]) -> float | None:
    """A stream's time to its first token (the writer's `first_token_ms`), else to its first chunk."""
    if not ex.stream or not ex.chunk_times:
        return None
    first_token_ms = row.get("first_token_ms")
    if isinstance(first_token_ms, int | float):
        return first_token_ms / 1000
    return max(ex.chunk_times[0], 0.0)


def _intervals(times: list[float]) -> tuple[float, ...]:
    """Each gap, never below 0 (`max(gap, 0.0)`); one subtraction per chunk, in C, when none is."""
    gaps = list(map(operator.sub, times[1:], times))
    if not gaps or min(gaps) >= 0.0:
        return tuple(gaps)
    return tuple(max(gap, 0.0) for gap in gaps)


def _request_changes(changes: list[Change]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for c in changes:
        if c.stage == "request":
            counts[c.kind] = counts.get(c.kind, 0) + 1
    return counts


def _prefix_cause(found: dict[str, Any] | None) -> str | None:
    cause = found.get("cause") if isinstance(found, dict) else None
    return cause if isinstance(cause, str) else None


def _repairs(changes: list[Change]) -> dict[str, int]:
    """Tool-call repairs by kind: the tool-call stage's changes, less what is no repair: its verdicts
    (an unrecoverable call, an engine error it replaced) and regeneration's records (issue 19: why an
    attempt was made or skipped, and the edits of an attempt's request)."""
    counts = Counter(
        c.kind
        for c in changes
        if c.stage == "toolcalls"
        and c.kind not in NOT_REPAIRS
        and not c.reason.startswith("unrecoverable")
        and not c.path.startswith("attempt[")
    )
    return dict(counts)


def _error_type(ex: Exchange, row: dict[str, Any], flags: frozenset[str]) -> str | None:
    """Why the exchange failed, low-cardinality (error.type), or None when it didn't."""
    if UNRECOVERABLE_FLAG in flags:
        return sc.ERROR_UNRECOVERABLE
    if ex.status is None:
        return sc.ERROR_RESET if ex.response_started_at is not None else sc.ERROR_NO_ANSWER
    if ex.status >= 400:
        return str(ex.status)
    if flags & RESET_FLAGS:
        return sc.ERROR_RESET
    if "upstream_error" in flags or (row.get("error") and ex.status >= 400):
        return sc.ERROR_UPSTREAM
    return None


def _server(url: str) -> tuple[str | None, int | None]:
    try:
        parts = urlsplit(url)
        return parts.hostname, parts.port or ({"https": 443, "http": 80}.get(parts.scheme))
    except ValueError:
        return None, None
