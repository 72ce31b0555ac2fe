"""A `Turn` as one OpenTelemetry GenAI inference span, built after the fact (imported only when export is on).

tapfix doesn't trace live: the exchange is over when its span is made, on the export worker, from
the summary the writer built. So the span is an SDK `ReadableSpan` made whole, with the exchange's
own ids (the client's trace, tapfix's span id that went upstream in `traceparent`, the client's span
as parent) and its real start and end, exactly what a live tracer would have sent, at none of the
hot path's cost. Names come from `semconv`; what is content (prompts, answers, a change's before
and after) is added only when the content mode asks and bodies are stored.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Sequence
from typing import Any

import orjson
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from tapfix.proxy.changes import Change
from tapfix.proxy.store.redact import redact_content
from tapfix.proxy.telemetry import semconv as sc
from tapfix.proxy.telemetry.config import ExportConfig
from tapfix.proxy.telemetry.turn import Turn

# Changes made to the request happen at the start of the span; the others while the answer passes.
_REQUEST_STAGES = frozenset({"router", "policy", "sampling", "reasoning", "telemetry"})
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


def resource_of(cfg: ExportConfig) -> Resource:
    """service.name and the OTEL_RESOURCE_ATTRIBUTES, over the SDK's own (telemetry.sdk.*)."""
    return Resource.create({**cfg.resource_attributes, "service.name": cfg.service_name})


@functools.cache
def scope(naming: sc.Naming = sc.CURRENT) -> InstrumentationScope:
    """tapfix's instrumentation scope (read once: the package metadata lookup costs more than a span)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        tapfix_version: str | None = version("tapfix")
    except PackageNotFoundError:  # pragma: no cover - a source tree run without installing
        tapfix_version = None
    schema = sc.LEGACY_SCHEMA_URL if naming == sc.LEGACY else sc.SCHEMA_URL
    return InstrumentationScope(sc.INSTRUMENTATION_SCOPE, tapfix_version, schema)


def span_of(turn: Turn, cfg: ExportConfig, resource: Resource, instrumentation: InstrumentationScope) -> ReadableSpan:
    trace_id = turn.trace_id or secrets.token_hex(16)
    span_id = turn.span_id or secrets.token_hex(8)
    context = SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=False, trace_flags=_SAMPLED)
    parent = None
    if turn.parent_span_id:
        parent = SpanContext(int(trace_id, 16), int(turn.parent_span_id, 16), is_remote=True, trace_flags=_SAMPLED)
    start = int(turn.started_at * 1e9)
    end = start + int((turn.duration_s or 0.0) * 1e9)
    content = cfg.captures_content and turn.store_bodies
    hidden = turn.secrets if content else None
    events = [_change_event(c, start if _on_request(c) else end, hidden) for c in turn.changes]
    attributes = attributes_of(turn, cfg)
    if turn.content is not None and turn.store_bodies:
        messages = _content_attributes(turn)
        if cfg.content_on_span:
            attributes |= messages
        if cfg.content_in_event:
            events.append(Event(sc.EVENT_INFERENCE_DETAILS, messages, timestamp=end))
    status = Status(StatusCode.ERROR, turn.error_type) if turn.error_type else Status(StatusCode.UNSET)
    return ReadableSpan(
        name=span_name(turn),
        context=context,
        parent=parent,
        resource=resource,
        attributes=attributes,
        events=events,
        kind=SpanKind.CLIENT,
        status=status,
        start_time=start,
        end_time=end,
        instrumentation_scope=instrumentation,
    )


def _on_request(change: Change) -> bool:
    return change.stage in _REQUEST_STAGES or change.path.startswith("headers.")


def span_name(turn: Turn) -> str:
    """`{gen_ai.operation.name} {gen_ai.request.model}`, the operation alone when no model is known."""
    return f"{turn.operation} {turn.request_model}" if turn.request_model else turn.operation


def attributes_of(turn: Turn, cfg: ExportConfig) -> dict[str, Any]:
    """The span's attributes, without content: GenAI's, then tapfix's own."""
    a: dict[str, Any] = {sc.GEN_AI_OPERATION_NAME: turn.operation}
    _put(a, sc.GEN_AI_PROVIDER_NAME, turn.provider)
    _put(a, sc.GEN_AI_REQUEST_MODEL, turn.request_model)
    a |= turn.request_params
    _put(a, sc.GEN_AI_RESPONSE_MODEL, turn.response_model)
    _put(a, sc.GEN_AI_RESPONSE_ID, turn.response_id)
    if turn.finish_reasons:
        a[sc.GEN_AI_RESPONSE_FINISH_REASONS] = turn.finish_reasons
    _put(a, sc.GEN_AI_USAGE_INPUT_TOKENS, turn.input_tokens)
    _put(a, sc.GEN_AI_USAGE_OUTPUT_TOKENS, turn.output_tokens)
    _put(a, sc.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS, turn.reasoning_tokens)
    _put(a, sc.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, turn.cached_tokens)
    cache_write = sc.GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS
    if cfg.naming == sc.LEGACY:
        cache_write = sc.LEGACY_GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS
    _put(a, cache_write, turn.cache_write_tokens)
    _put(a, sc.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, turn.time_to_first_chunk_s)
    _put(a, sc.GEN_AI_CONVERSATION_ID, turn.session_id)
    _put(a, sc.SERVER_ADDRESS, turn.server_address)
    _put(a, sc.SERVER_PORT, turn.server_port)
    _put(a, sc.ERROR_TYPE, turn.error_type)
    a[sc.TAPFIX_CAPTURE_ID] = turn.capture_id
    if cfg.browse_url:
        a[sc.TAPFIX_CAPTURE_URL] = f"{cfg.browse_url}/exchange/{turn.capture_id}"
    a[sc.TAPFIX_OUTCOME] = turn.outcome
    a[sc.TAPFIX_SURFACE] = turn.surface
    _put(a, sc.TAPFIX_UPSTREAM, turn.upstream)
    _put(a, sc.TAPFIX_PUBLIC_MODEL, turn.public_model)
    _put(a, sc.TAPFIX_STATUS, turn.status)
    a[sc.TAPFIX_CHANGES_COUNT] = len(turn.changes)
    a[sc.TAPFIX_REPAIRS_COUNT] = sum(turn.repairs.values())
    for kind, count in sorted(turn.repairs.items()):
        a[sc.TAPFIX_REPAIRS_PREFIX + kind] = count
    a[sc.TAPFIX_FLAGS] = tuple(sorted(turn.flags))
    a[sc.TAPFIX_UNRECOVERABLE] = turn.unrecoverable
    if turn.attempt_of is not None:
        a[sc.TAPFIX_ATTEMPT] = turn.attempt
        a[sc.TAPFIX_ATTEMPT_OF] = turn.attempt_of
    return a


def _put(attributes: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        attributes[key] = value


def _content_attributes(turn: Turn) -> dict[str, Any]:
    assert turn.content is not None
    a: dict[str, Any] = {
        sc.GEN_AI_INPUT_MESSAGES: turn.content.input_messages,
        sc.GEN_AI_OUTPUT_MESSAGES: turn.content.output_messages,
    }
    _put(a, sc.GEN_AI_SYSTEM_INSTRUCTIONS, turn.content.system_instructions)
    return a


def _change_event(change: Change, timestamp: int, secrets: tuple[str, ...] | None) -> Event:
    """One change as a span event; its before and after (content) only when `secrets` is given."""
    a: dict[str, Any] = {
        sc.CHANGE_STAGE: change.stage,
        sc.CHANGE_KIND: change.kind,
        sc.CHANGE_PATH: change.path,
        sc.CHANGE_REASON: change.reason,
    }
    if secrets is not None:
        a[sc.CHANGE_BEFORE] = _json(change.before, secrets)
        a[sc.CHANGE_AFTER] = _json(change.after, secrets)
    return Event(sc.EVENT_CHANGE, a, timestamp=timestamp)


def _json(value: Any, secrets: tuple[str, ...]) -> str:
    return redact_content(orjson.dumps(value, default=str).decode(), secrets)


def spans_of(turns: Sequence[Turn], cfg: ExportConfig, resource: Resource) -> list[ReadableSpan]:
    instrumentation = scope(cfg.naming)
    return [span_of(t, cfg, resource, instrumentation) for t in turns]
