"""Every OpenTelemetry name tapfix emits, as a literal, in one place (docs/opentelemetry.md's table is made from it).

The GenAI names follow semantic-conventions-genai v0.1.0, the first release of the GenAI conventions
in their own repository (open-telemetry/semantic-conventions-genai, docs/gen-ai/client-inference.md):
the inference metrics are `gen_ai.client.inference.*` (#521), token usage is counted by
`gen_ai.client.inference.usage.*` counters beside per-operation histograms (#374), and cache writes
are `cache_write` (#440). The names of semantic-conventions v1.41.0, the last release before the move,
stay available for one release (`LEGACY_*`, with `TAPFIX_GENAI_SEMCONV=1.41.0`) so dashboards can move
over. What tapfix knows and the conventions don't name is under `tapfix.*`. Literals, not imports from
`opentelemetry.semconv`: this module is read with export off, when opentelemetry isn't installed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

SEMCONV_VERSION: Final = "semantic-conventions-genai 0.1.0"
# The GenAI repository publishes no schema URL of its own yet (its README says TODO): the base
# conventions v0.1.0 builds on.
SCHEMA_URL: Final = "https://opentelemetry.io/schemas/1.45.0"
LEGACY_SCHEMA_URL: Final = "https://opentelemetry.io/schemas/1.41.0"
INSTRUMENTATION_SCOPE: Final = "tapfix"

# Which names tapfix emits: the current conventions, or v1.41.0's for one more release.
Naming = Literal["genai-0.1.0", "1.41.0"]
NAMINGS: Final[tuple[Naming, ...]] = ("genai-0.1.0", "1.41.0")
CURRENT: Final[Naming] = "genai-0.1.0"
LEGACY: Final[Naming] = "1.41.0"
NAMING_VARIABLE: Final = "TAPFIX_GENAI_SEMCONV"


def naming_of(env: Mapping[str, str]) -> Naming:
    """The naming `TAPFIX_GENAI_SEMCONV` asks for (the current one when unset); ValueError for another value."""
    value = env.get(NAMING_VARIABLE, "").strip() or CURRENT
    for naming in NAMINGS:
        if value == naming:
            return naming
    raise ValueError(f"{NAMING_VARIABLE} {value!r}: give {' or '.join(NAMINGS)}")


# --- spans: the inference span (span name `{gen_ai.operation.name} {gen_ai.request.model}`) ------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE: Final = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P: Final = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K: Final = "gen_ai.request.top_k"
GEN_AI_REQUEST_FREQUENCY_PENALTY: Final = "gen_ai.request.frequency_penalty"
GEN_AI_REQUEST_PRESENCE_PENALTY: Final = "gen_ai.request.presence_penalty"
GEN_AI_REQUEST_STOP_SEQUENCES: Final = "gen_ai.request.stop_sequences"
GEN_AI_REQUEST_SEED: Final = "gen_ai.request.seed"
GEN_AI_REQUEST_CHOICE_COUNT: Final = "gen_ai.request.choice.count"
GEN_AI_REQUEST_STREAM: Final = "gen_ai.request.stream"
GEN_AI_REQUEST_ENCODING_FORMATS: Final = "gen_ai.request.encoding_formats"
# Not in v1.41.0: the name semantic-conventions-genai gives the reasoning effort as requested.
GEN_AI_REQUEST_REASONING_LEVEL: Final = "gen_ai.request.reasoning.level"
GEN_AI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GEN_AI_RESPONSE_ID: Final = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_USAGE_REASONING_OUTPUT_TOKENS: Final = "gen_ai.usage.reasoning.output_tokens"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_CACHE_WRITE_INPUT_TOKENS: Final = "gen_ai.usage.cache_write.input_tokens"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
ERROR_TYPE: Final = "error.type"

# --- content: only when OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT asks ------------------
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
GEN_AI_SYSTEM_INSTRUCTIONS: Final = "gen_ai.system_instructions"
# The event that carries the content in EVENT_ONLY / SPAN_AND_EVENT (a span event here).
EVENT_INFERENCE_DETAILS: Final = "gen_ai.client.inference.operation.details"

# --- gen_ai.operation.name values --------------------------------------------------------------
OP_CHAT: Final = "chat"
OP_TEXT_COMPLETION: Final = "text_completion"
OP_EMBEDDINGS: Final = "embeddings"

# --- metrics (metrics.py's catalogue) ------------------------------------------------------------
METRIC_INFERENCE_DURATION: Final = "gen_ai.client.inference.duration"
METRIC_INFERENCE_TIME_TO_FIRST_CHUNK: Final = "gen_ai.client.inference.time_to_first_chunk"
METRIC_INFERENCE_TIME_PER_OUTPUT_CHUNK: Final = "gen_ai.client.inference.time_per_output_chunk"
METRIC_USAGE_INPUT_TOKENS: Final = "gen_ai.client.inference.usage.input_tokens"
METRIC_USAGE_OUTPUT_TOKENS: Final = "gen_ai.client.inference.usage.output_tokens"
METRIC_USAGE_CACHE_READ_INPUT_TOKENS: Final = "gen_ai.client.inference.usage.cache_read.input_tokens"
METRIC_USAGE_CACHE_WRITE_INPUT_TOKENS: Final = "gen_ai.client.inference.usage.cache_write.input_tokens"
METRIC_USAGE_REASONING_OUTPUT_TOKENS: Final = "gen_ai.client.inference.usage.reasoning.output_tokens"
METRIC_OPERATION_INPUT_TOKENS: Final = "gen_ai.client.inference.operation.input_tokens"
METRIC_OPERATION_OUTPUT_TOKENS: Final = "gen_ai.client.inference.operation.output_tokens"
# Operations other than inference (embeddings) keep the general duration.
METRIC_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
GEN_AI_TOKEN_MODALITY: Final = "gen_ai.token.modality"
TOKEN_MODALITY_UNKNOWN: Final = "unknown"  # engines don't break usage down by modality
# tapfix's own metrics (Prometheus: dots become underscores, counters end in `_total`).
METRIC_REQUESTS: Final = "tapfix.requests"
METRIC_REPAIRS: Final = "tapfix.repairs"
METRIC_UNRECOVERABLE_CALLS: Final = "tapfix.unrecoverable_calls"
METRIC_PROMPT_TRUNCATED: Final = "tapfix.prompt_truncated"
METRIC_REGENERATIONS: Final = "tapfix.regenerations"
METRIC_CAPTURE_FAILURES: Final = "tapfix.capture.failures"
METRIC_WRITER_QUEUE_DEPTH: Final = "tapfix.writer.queue_depth"
METRIC_REASONING_REPLAY: Final = "tapfix.reasoning_replay"  # issue 36: assistant turns, replayed or missed
METRIC_REQUEST_CHANGES: Final = "tapfix.request_changes"  # what tapfix changed in requests, by kind
METRIC_PREFIX_BREAKS: Final = "tapfix.prefix_breaks"  # turns whose prompt stopped extending the last, by cause
# Their attributes besides the span's (tapfix.upstream, tapfix.surface, tapfix.capture.outcome).
TAPFIX_STATUS_CLASS: Final = "tapfix.http.status_class"  # 2xx..5xx, none
TAPFIX_REPAIR_KIND: Final = "tapfix.repair.kind"
TAPFIX_ATTEMPT_OUTCOME: Final = "tapfix.attempt.outcome"  # a regeneration: ok, unrecoverable, error
TAPFIX_REPLAY_OUTCOME: Final = "tapfix.replay.outcome"  # a resent turn's reasoning: replayed, missed
TAPFIX_CHANGE_KIND: Final = "tapfix.change.kind"  # a request-side change: strip_billing_line, ...
TAPFIX_PREFIX_CAUSE: Final = "tapfix.prefix_break.cause"  # billing_line, timestamp, system_edited, ...

# --- tapfix's own span attributes ---------------------------------------------------------------
TAPFIX_CAPTURE_ID: Final = "tapfix.capture.id"
TAPFIX_CAPTURE_URL: Final = "tapfix.capture.url"  # the browser's page, with --browse-url
TAPFIX_OUTCOME: Final = "tapfix.capture.outcome"  # stored, kept, lost
TAPFIX_SURFACE: Final = "tapfix.surface"  # chat, completions, responses, messages, other
TAPFIX_UPSTREAM: Final = "tapfix.upstream"  # the configured upstream's name
TAPFIX_PUBLIC_MODEL: Final = "tapfix.model"  # the model name the client asked for
TAPFIX_STATUS: Final = "tapfix.http.status"  # what the client got
TAPFIX_CHANGES_COUNT: Final = "tapfix.changes.count"
TAPFIX_REPAIRS_COUNT: Final = "tapfix.repairs.count"
TAPFIX_REPAIRS_PREFIX: Final = "tapfix.repairs."  # + kind: tool-call repairs of that kind
TAPFIX_FLAGS: Final = "tapfix.flags"
TAPFIX_UNRECOVERABLE: Final = "tapfix.unrecoverable"
TAPFIX_ATTEMPT: Final = "tapfix.attempt"
TAPFIX_ATTEMPT_OF: Final = "tapfix.attempt_of"

# --- tapfix's span events: one per change --------------------------------------------------------
EVENT_CHANGE: Final = "tapfix.change"
CHANGE_STAGE: Final = "tapfix.change.stage"
CHANGE_KIND: Final = "tapfix.change.kind"
CHANGE_PATH: Final = "tapfix.change.path"
CHANGE_REASON: Final = "tapfix.change.reason"
CHANGE_BEFORE: Final = "tapfix.change.before"  # content: only when content is captured
CHANGE_AFTER: Final = "tapfix.change.after"

# --- error.type values tapfix sets besides the HTTP status ("500", "429", ...) --------------------
ERROR_UNRECOVERABLE: Final = "tapfix.unrecoverable_tool_call"
ERROR_RESET: Final = "tapfix.reset"  # the connection ended without a complete answer
ERROR_NO_ANSWER: Final = "tapfix.no_answer"  # the upstream never answered
ERROR_UPSTREAM: Final = "tapfix.upstream_error"  # an error object inside a 200 answer

# --- v1.41.0's names, emitted instead of their successors with TAPFIX_GENAI_SEMCONV=1.41.0 ----------
LEGACY_METRIC_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
LEGACY_METRIC_TIME_TO_FIRST_CHUNK: Final = "gen_ai.client.operation.time_to_first_chunk"
LEGACY_METRIC_TIME_PER_OUTPUT_CHUNK: Final = "gen_ai.client.operation.time_per_output_chunk"
LEGACY_GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"
LEGACY_TOKEN_TYPE_INPUT: Final = "input"
LEGACY_TOKEN_TYPE_OUTPUT: Final = "output"
LEGACY_GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS: Final = "gen_ai.usage.cache_creation.input_tokens"

# --- the docs' table -----------------------------------------------------------------------------
_KINDS = (
    ("LEGACY_METRIC_", "metric (1.41.0 naming)"),
    ("LEGACY_GEN_AI_TOKEN_TYPE", "metric attribute (1.41.0 naming)"),
    ("LEGACY_TOKEN_TYPE_", "gen_ai.token.type value (1.41.0 naming)"),
    ("LEGACY_GEN_AI_", "span attribute (1.41.0 naming)"),
    ("METRIC_", "metric"),
    ("GEN_AI_TOKEN_MODALITY", "metric attribute"),
    ("TOKEN_MODALITY_", "gen_ai.token.modality value"),
    ("TAPFIX_STATUS_CLASS", "metric attribute (tapfix)"),
    ("TAPFIX_REPAIR_KIND", "metric attribute (tapfix)"),
    ("TAPFIX_ATTEMPT_OUTCOME", "metric attribute (tapfix)"),
    ("TAPFIX_REPLAY_OUTCOME", "metric attribute (tapfix)"),
    ("TAPFIX_CHANGE_KIND", "metric attribute (tapfix)"),
    ("TAPFIX_PREFIX_CAUSE", "metric attribute (tapfix)"),
    ("EVENT_", "span event"),
    ("CHANGE_", "change event attribute"),
    ("OP_", "gen_ai.operation.name value"),
    ("ERROR_TYPE", "span attribute"),
    ("ERROR_", "error.type value"),
    ("TAPFIX_REPAIRS_PREFIX", "span attribute prefix (+ repair kind)"),
    ("TAPFIX_", "span attribute (tapfix)"),
    ("", "span attribute"),
)
_NOT_NAMES = frozenset(
    {
        "SEMCONV_VERSION",
        "SCHEMA_URL",
        "LEGACY_SCHEMA_URL",
        "INSTRUMENTATION_SCOPE",
        "CURRENT",
        "LEGACY",
        "NAMING_VARIABLE",
    }
)


def names_table() -> str:
    """Every name above as a markdown table, in this module's order (`python -m tapfix.proxy.telemetry.semconv`)."""
    rows = ["| name | what |", "| --- | --- |"]
    for constant, value in list(globals().items()):
        if not constant.isupper() or constant.startswith("_") or constant in _NOT_NAMES or not isinstance(value, str):
            continue
        kind = next(k for prefix, k in _KINDS if constant.startswith(prefix))
        rows.append(f"| `{value}` | {kind} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(f"OpenTelemetry semantic conventions {SEMCONV_VERSION}\n")
    print(names_table())
