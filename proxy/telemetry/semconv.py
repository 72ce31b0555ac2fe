"""Every OpenTelemetry name tapfix emits, as a literal, in one place (the README's table is made from it).

The GenAI names follow semantic conventions v1.41.0, the last release of open-telemetry/
semantic-conventions that holds the GenAI conventions (they moved to semantic-conventions-genai
after it). What that release lacks and tapfix knows is named after newer GenAI drafts where one
exists (`gen_ai.request.reasoning.level`), and under `tapfix.*` otherwise. Literals, not imports from
`opentelemetry.semconv`: this module is read with export off, when opentelemetry isn't installed.
"""

from __future__ import annotations

from typing import Final

SEMCONV_VERSION: Final = "1.41.0"
SCHEMA_URL: Final = "https://opentelemetry.io/schemas/1.41.0"
INSTRUMENTATION_SCOPE: Final = "tapfix"

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

# --- metrics (helper METRICS records them) ------------------------------------------------------
METRIC_TOKEN_USAGE: Final = "gen_ai.client.token.usage"
METRIC_OPERATION_DURATION: Final = "gen_ai.client.operation.duration"
METRIC_TIME_TO_FIRST_CHUNK: Final = "gen_ai.client.operation.time_to_first_chunk"
METRIC_TIME_PER_OUTPUT_CHUNK: Final = "gen_ai.client.operation.time_per_output_chunk"
GEN_AI_TOKEN_TYPE: Final = "gen_ai.token.type"
TOKEN_TYPE_INPUT: Final = "input"
TOKEN_TYPE_OUTPUT: Final = "output"
# tapfix's own metrics (Prometheus: dots become underscores, counters end in `_total`).
METRIC_REQUESTS: Final = "tapfix.requests"
METRIC_REPAIRS: Final = "tapfix.repairs"
METRIC_UNRECOVERABLE_CALLS: Final = "tapfix.unrecoverable_calls"
METRIC_REGENERATIONS: Final = "tapfix.regenerations"
METRIC_CAPTURE_FAILURES: Final = "tapfix.capture.failures"
METRIC_WRITER_QUEUE_DEPTH: Final = "tapfix.writer.queue_depth"
# Their attributes besides the span's (tapfix.upstream, tapfix.surface, tapfix.capture.outcome).
TAPFIX_STATUS_CLASS: Final = "tapfix.http.status_class"  # 2xx..5xx, none
TAPFIX_REPAIR_KIND: Final = "tapfix.repair.kind"
TAPFIX_ATTEMPT_OUTCOME: Final = "tapfix.attempt.outcome"  # a regeneration: ok, unrecoverable, error

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

# --- the README's table -------------------------------------------------------------------------
_KINDS = (
    ("METRIC_", "metric"),
    ("GEN_AI_TOKEN_TYPE", "metric attribute"),
    ("TAPFIX_STATUS_CLASS", "metric attribute (tapfix)"),
    ("TAPFIX_REPAIR_KIND", "metric attribute (tapfix)"),
    ("TAPFIX_ATTEMPT_OUTCOME", "metric attribute (tapfix)"),
    ("EVENT_", "span event"),
    ("CHANGE_", "change event attribute"),
    ("OP_", "gen_ai.operation.name value"),
    ("TOKEN_TYPE_", "gen_ai.token.type value"),
    ("ERROR_TYPE", "span attribute"),
    ("ERROR_", "error.type value"),
    ("TAPFIX_REPAIRS_PREFIX", "span attribute prefix (+ repair kind)"),
    ("TAPFIX_", "span attribute (tapfix)"),
    ("", "span attribute"),
)
_NOT_NAMES = frozenset({"SEMCONV_VERSION", "SCHEMA_URL", "INSTRUMENTATION_SCOPE"})


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
