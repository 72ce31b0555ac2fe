"""The one catalogue of tapfix's metrics: names, units, buckets and labels, and `observations(turn)`.

`aggregate.py` records each exchange's observations once; `/tapfix/metrics` (`prometheus.py`) and
the OTLP export (`otel_metrics.py`) both read that one aggregation, so a dashboard built on one reads
the same numbers from the other. The GenAI conventions' client metrics come first (their names, units,
attributes and bucket advice, in the naming `TAPFIX_GENAI_SEMCONV` picks: a `Catalogue`); tapfix's own
follow: repairs, unrecoverable calls, regenerations, capture failures, the write queue.

Every label value is bounded (`Labeller`): never user text, at most `LABEL_LIMIT` distinct values
per label, then `other`; the model label is the configured public name in config mode (anything
else is `other`), the first `LABEL_LIMIT` names seen in quick mode, where clients name any model.

Recording runs on the capture writer's thread (an observer of `CaptureWriter`), after the exchange's
commit: the event loop never records a metric, and a per-chunk histogram costs it nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tapfix.proxy.telemetry import semconv as sc
from tapfix.proxy.telemetry.turn import Turn
from tapfix.proxy.window.truncation import FLAG as TRUNCATED

LABEL_LIMIT = 50  # distinct values a label takes before the rest are `other`
OTHER = "other"
Kind = Literal["counter", "histogram", "gauge"]


# The catalogue's labels and instruments are singletons, keys of every recording's dicts: hashed by
# identity (`eq=False`), as a field-by-field hash per lookup was most of what recording an exchange cost.
@dataclass(frozen=True, slots=True, eq=False)
class Label:
    """One label: its short Prometheus name, and the attribute name OTLP gives it (the conventions')."""

    prometheus: str
    attribute: str


OPERATION = Label("operation", sc.GEN_AI_OPERATION_NAME)
PROVIDER = Label("provider", sc.GEN_AI_PROVIDER_NAME)
MODEL = Label("model", sc.GEN_AI_REQUEST_MODEL)  # the configured public name, bounded
TOKEN_TYPE = Label("token_type", sc.LEGACY_GEN_AI_TOKEN_TYPE)  # v1.41.0's token usage histogram
MODALITY = Label("modality", sc.GEN_AI_TOKEN_MODALITY)
ERROR_TYPE = Label("error_type", sc.ERROR_TYPE)
UPSTREAM = Label("upstream", sc.TAPFIX_UPSTREAM)
SURFACE = Label("surface", sc.TAPFIX_SURFACE)
STATUS_CLASS = Label("status_class", sc.TAPFIX_STATUS_CLASS)
KIND = Label("kind", sc.TAPFIX_REPAIR_KIND)
OUTCOME = Label("outcome", sc.TAPFIX_OUTCOME)  # capture: kept, lost
ATTEMPT_OUTCOME = Label("outcome", sc.TAPFIX_ATTEMPT_OUTCOME)  # a regeneration: ok, unrecoverable, error
REPLAY_OUTCOME = Label("outcome", sc.TAPFIX_REPLAY_OUTCOME)  # reasoning replay: replayed, missed
CHANGE_KIND = Label("kind", sc.TAPFIX_CHANGE_KIND)  # a request-side change
CAUSE = Label("cause", sc.TAPFIX_PREFIX_CAUSE)  # a prefix break's (request/prefix_break.py CAUSES: bounded)

_GENAI = (OPERATION, PROVIDER, MODEL, UPSTREAM, SURFACE)


@dataclass(frozen=True, slots=True, eq=False)
class Instrument:
    """A metric as both expositions name it. `unit` is UCUM as OTel has it (`s`, `{token}`)."""

    name: str
    kind: Kind
    unit: str
    description: str
    labels: tuple[Label, ...]
    buckets: tuple[float, ...] | None = None  # histograms: the conventions' bucket advice

    @property
    def prometheus_name(self) -> str:
        """Dots to underscores; prometheus_client adds the unit and `_total` itself."""
        return re.sub(r"[^a-zA-Z0-9_]", "_", self.name)

    @property
    def prometheus_unit(self) -> str:
        """`s` is `seconds`; an annotation (`{token}`) is no unit, as OTel's Prometheus mapping drops it."""
        return {"s": "seconds", "By": "bytes"}.get(self.unit, "" if self.unit.startswith("{") else self.unit)


_TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
_FIRST_CHUNK_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_PER_CHUNK_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)


def _usage(name: str, what: str) -> Instrument:
    return Instrument(name, "counter", "{token}", what, (*_GENAI, MODALITY))


# The GenAI conventions' client metrics (semconv.SEMCONV_VERSION), with their bucket advice.
INFERENCE_DURATION = Instrument(
    sc.METRIC_INFERENCE_DURATION,
    "histogram",
    "s",
    "GenAI inference duration: from the client's request to the end of the answer.",
    (*_GENAI, ERROR_TYPE),
    _DURATION_BUCKETS,
)
OPERATION_DURATION = Instrument(
    sc.METRIC_OPERATION_DURATION,
    "histogram",
    "s",
    "GenAI operation duration (operations other than inference: embeddings).",
    (*_GENAI, ERROR_TYPE),
    _DURATION_BUCKETS,
)
TIME_TO_FIRST_CHUNK = Instrument(
    sc.METRIC_INFERENCE_TIME_TO_FIRST_CHUNK,
    "histogram",
    "s",
    "Time to the first chunk of a streamed answer.",
    _GENAI,
    _FIRST_CHUNK_BUCKETS,
)
TIME_PER_OUTPUT_CHUNK = Instrument(
    sc.METRIC_INFERENCE_TIME_PER_OUTPUT_CHUNK,
    "histogram",
    "s",
    "Time between consecutive chunks of a streamed answer, one value per chunk after the first.",
    _GENAI,
    _PER_CHUNK_BUCKETS,
)
USAGE_INPUT = _usage(sc.METRIC_USAGE_INPUT_TOKENS, "Input (prompt) tokens used, cached ones included.")
USAGE_OUTPUT = _usage(sc.METRIC_USAGE_OUTPUT_TOKENS, "Output (completion) tokens used, reasoning included.")
USAGE_CACHE_READ = _usage(sc.METRIC_USAGE_CACHE_READ_INPUT_TOKENS, "Input tokens served from the provider's cache.")
USAGE_CACHE_WRITE = _usage(sc.METRIC_USAGE_CACHE_WRITE_INPUT_TOKENS, "Input tokens written to the provider's cache.")
USAGE_REASONING = _usage(sc.METRIC_USAGE_REASONING_OUTPUT_TOKENS, "Output tokens used for reasoning.")
OPERATION_INPUT = Instrument(
    sc.METRIC_OPERATION_INPUT_TOKENS, "histogram", "{token}", "Input tokens per exchange.", _GENAI, _TOKEN_BUCKETS
)
OPERATION_OUTPUT = Instrument(
    sc.METRIC_OPERATION_OUTPUT_TOKENS, "histogram", "{token}", "Output tokens per exchange.", _GENAI, _TOKEN_BUCKETS
)
# v1.41.0's, for TAPFIX_GENAI_SEMCONV=1.41.0 (one release).
LEGACY_TOKEN_USAGE = Instrument(
    sc.LEGACY_METRIC_TOKEN_USAGE,
    "histogram",
    "{token}",
    "Number of input and output tokens used, per exchange.",
    (*_GENAI, TOKEN_TYPE),
    _TOKEN_BUCKETS,
)
LEGACY_OPERATION_DURATION = Instrument(
    sc.METRIC_OPERATION_DURATION,
    "histogram",
    "s",
    "GenAI operation duration: from the client's request to the end of the answer.",
    (*_GENAI, ERROR_TYPE),
    _DURATION_BUCKETS,
)
LEGACY_TIME_TO_FIRST_CHUNK = Instrument(
    sc.LEGACY_METRIC_TIME_TO_FIRST_CHUNK,
    "histogram",
    "s",
    TIME_TO_FIRST_CHUNK.description,
    _GENAI,
    _FIRST_CHUNK_BUCKETS,
)
LEGACY_TIME_PER_OUTPUT_CHUNK = Instrument(
    sc.LEGACY_METRIC_TIME_PER_OUTPUT_CHUNK,
    "histogram",
    "s",
    TIME_PER_OUTPUT_CHUNK.description,
    _GENAI,
    _PER_CHUNK_BUCKETS,
)
# tapfix's own.
REQUESTS = Instrument(
    sc.METRIC_REQUESTS,
    "counter",
    "{request}",
    "Client requests through the proxy, by answer status class (regeneration attempts are counted apart).",
    (MODEL, UPSTREAM, SURFACE, STATUS_CLASS),
)
REPAIRS = Instrument(
    sc.METRIC_REPAIRS,
    "counter",
    "{repair}",
    "Tool-call repairs tapfix made, by kind.",
    (MODEL, UPSTREAM, SURFACE, KIND),
)
UNRECOVERABLE = Instrument(
    sc.METRIC_UNRECOVERABLE_CALLS,
    "counter",
    "{exchange}",
    "Exchanges with a tool call tapfix could not repair (flag toolcall_unrecoverable), an attempt's too.",
    (MODEL, UPSTREAM, SURFACE),
)
PROMPT_TRUNCATED = Instrument(
    sc.METRIC_PROMPT_TRUNCATED,
    "counter",
    "{exchange}",
    "Exchanges whose prompt the engine cut to its window and answered (flag prompt_truncated).",
    (MODEL, UPSTREAM, SURFACE),
)
REGENERATIONS = Instrument(
    sc.METRIC_REGENERATIONS,
    "counter",
    "{attempt}",
    "Regeneration attempts (attempt 2 and later), by outcome: ok, unrecoverable, error.",
    (MODEL, UPSTREAM, SURFACE, ATTEMPT_OUTCOME),
)
CAPTURE_FAILURES = Instrument(
    sc.METRIC_CAPTURE_FAILURES,
    "counter",
    "{exchange}",
    "Exchanges the store could not keep whole: kept (metadata and raw bytes only) or lost (nothing).",
    (OUTCOME,),
)
QUEUE_DEPTH = Instrument(
    sc.METRIC_WRITER_QUEUE_DEPTH,
    "gauge",
    "{exchange}",
    "Exchanges waiting for the capture writer, read at scrape or collection time.",
    (),
)
REASONING_REPLAY = Instrument(
    sc.METRIC_REASONING_REPLAY,
    "counter",
    "{turn}",
    "Assistant turns resent without reasoning: replayed (the recorded reasoning put back) or missed (none found).",
    (MODEL, UPSTREAM, SURFACE, REPLAY_OUTCOME),
)
REQUEST_CHANGES = Instrument(
    sc.METRIC_REQUEST_CHANGES,
    "counter",
    "{change}",
    "Changes tapfix made to requests before the upstream, by kind (strip_billing_line: Claude Code's billing line).",
    (MODEL, UPSTREAM, SURFACE, CHANGE_KIND),
)
PREFIX_BREAKS = Instrument(
    sc.METRIC_PREFIX_BREAKS,
    "counter",
    "{request}",
    "Requests whose prompt stopped extending the previous request of their thread (the engine's prefix cache"
    " missed from there), by cause.",
    (MODEL, UPSTREAM, SURFACE, CAUSE),
)
_TAPFIX = (
    REQUESTS,
    REPAIRS,
    UNRECOVERABLE,
    PROMPT_TRUNCATED,
    REGENERATIONS,
    REASONING_REPLAY,
    CAPTURE_FAILURES,
    QUEUE_DEPTH,
    REQUEST_CHANGES,
    PREFIX_BREAKS,
)


@dataclass(frozen=True, slots=True, eq=False)
class Catalogue:
    """The instruments one naming emits (`semconv.Naming`), and which of them records what."""

    naming: sc.Naming
    instruments: tuple[Instrument, ...]
    inference_duration: Instrument
    other_duration: Instrument  # embeddings
    time_to_first_chunk: Instrument
    time_per_output_chunk: Instrument


CURRENT = Catalogue(
    sc.CURRENT,
    (
        USAGE_INPUT,
        USAGE_OUTPUT,
        USAGE_CACHE_READ,
        USAGE_CACHE_WRITE,
        USAGE_REASONING,
        OPERATION_INPUT,
        OPERATION_OUTPUT,
        INFERENCE_DURATION,
        OPERATION_DURATION,
        TIME_TO_FIRST_CHUNK,
        TIME_PER_OUTPUT_CHUNK,
        *_TAPFIX,
    ),
    INFERENCE_DURATION,
    OPERATION_DURATION,
    TIME_TO_FIRST_CHUNK,
    TIME_PER_OUTPUT_CHUNK,
)
LEGACY = Catalogue(
    sc.LEGACY,
    (LEGACY_TOKEN_USAGE, LEGACY_OPERATION_DURATION, LEGACY_TIME_TO_FIRST_CHUNK, LEGACY_TIME_PER_OUTPUT_CHUNK, *_TAPFIX),
    LEGACY_OPERATION_DURATION,
    LEGACY_OPERATION_DURATION,
    LEGACY_TIME_TO_FIRST_CHUNK,
    LEGACY_TIME_PER_OUTPUT_CHUNK,
)
CATALOGUES = {c.naming: c for c in (CURRENT, LEGACY)}
CATALOGUE = CURRENT.instruments  # what tapfix emits by default


class Bounded:
    """The first `limit` distinct values, then `other`; with `allowed`, only those (config mode's models)."""

    def __init__(self, limit: int = LABEL_LIMIT, allowed: Mapping[str, str] | None = None) -> None:
        self.limit = limit
        self.allowed = allowed
        self._seen: set[str] = set()

    def __call__(self, value: str | None) -> str | None:
        if value is None:
            return None
        if self.allowed is not None:
            return self.allowed.get(value, OTHER)
        if value in self._seen:
            return value
        if len(self._seen) < self.limit:
            self._seen.add(value)
            return value
        return OTHER


class Labeller:
    """Bounded values for a turn's labels; one per process, called on the writer thread only."""

    def __init__(self, served_models: Mapping[str, str] | None = None) -> None:
        """`served_models`: name or alias -> public name (config mode); None: quick mode."""
        labels = (OPERATION, PROVIDER, UPSTREAM, SURFACE, KIND, ERROR_TYPE, CHANGE_KIND, CAUSE)
        self._bounds = {label: Bounded() for label in labels}
        self._bounds[MODEL] = Bounded(allowed=served_models)

    @classmethod
    def for_config(cls, config: Any) -> Labeller:
        """Config mode knows the names it serves; quick mode (or no config) passes any name through."""
        if config is None or config.is_quick:
            return cls(None)
        served = {name: name for name in config.models} | dict(config.aliases())
        return cls(served)

    def value(self, label: Label, value: str | None) -> str | None:
        bound = self._bounds.get(label)
        return bound(value) if bound is not None else value

    def base(self, turn: Turn) -> dict[Label, str | None]:
        return {
            OPERATION: self.value(OPERATION, turn.operation),
            PROVIDER: self.value(PROVIDER, turn.provider),
            MODEL: self.value(MODEL, turn.public_model),
            UPSTREAM: self.value(UPSTREAM, turn.upstream),
            SURFACE: self.value(SURFACE, turn.surface),
            STATUS_CLASS: turn.status_class,
        }


# An instrument, the values one exchange adds to it (one, or one per chunk), and their labels.
Observation = tuple[Instrument, Sequence[float], dict[Label, str | None]]


def observations(turn: Turn, labeller: Labeller, catalogue: Catalogue = CURRENT) -> Iterator[Observation]:
    """What one finished exchange adds to each instrument: the single recipe of every number."""
    if turn.outcome in ("kept", "lost"):
        yield CAPTURE_FAILURES, (1,), {OUTCOME: turn.outcome}
    base = labeller.base(turn)
    if turn.attempt_of is None:  # a regeneration attempt is no client request: REGENERATIONS counts it
        yield REQUESTS, (1,), base
    for kind, count in sorted(turn.repairs.items()):
        yield REPAIRS, (count,), base | {KIND: labeller.value(KIND, kind)}
    if turn.unrecoverable:
        yield UNRECOVERABLE, (1,), base
    for outcome, count in turn.reasoning_replay.items():
        if count:
            yield REASONING_REPLAY, (count,), base | {REPLAY_OUTCOME: outcome}
    for kind, count in sorted(turn.request_changes.items()):
        yield REQUEST_CHANGES, (count,), base | {CHANGE_KIND: labeller.value(CHANGE_KIND, kind)}
    if turn.prefix_break_cause is not None:
        yield PREFIX_BREAKS, (1,), base | {CAUSE: labeller.value(CAUSE, turn.prefix_break_cause)}
    if TRUNCATED in turn.flags:
        yield PROMPT_TRUNCATED, (1,), base
    if turn.attempt >= 2:
        outcome = "unrecoverable" if turn.unrecoverable else "error" if turn.error_type else "ok"
        yield REGENERATIONS, (1,), base | {ATTEMPT_OUTCOME: outcome}
    if not turn.is_genai:  # not an inference (or embeddings) call: no GenAI metrics
        return
    inference = turn.operation != sc.OP_EMBEDDINGS
    if catalogue is LEGACY:
        for token_type, tokens in (
            (sc.LEGACY_TOKEN_TYPE_INPUT, turn.input_tokens),
            (sc.LEGACY_TOKEN_TYPE_OUTPUT, turn.output_tokens),
        ):
            if tokens is not None:
                yield LEGACY_TOKEN_USAGE, (tokens,), base | {TOKEN_TYPE: token_type}
    elif inference:
        yield from _usage_observations(turn, base)
    if turn.duration_s is not None:
        error = labeller.value(ERROR_TYPE, turn.error_type)
        duration = catalogue.inference_duration if inference else catalogue.other_duration
        yield duration, (turn.duration_s,), base | {ERROR_TYPE: error}
    if turn.stream and turn.time_to_first_chunk_s is not None:
        yield catalogue.time_to_first_chunk, (turn.time_to_first_chunk_s,), base
    if turn.stream and turn.chunk_intervals_s:
        yield catalogue.time_per_output_chunk, turn.chunk_intervals_s, base


def _usage_observations(turn: Turn, base: dict[Label, str | None]) -> Iterator[Observation]:
    """Token counts: the usage counters (the provider doesn't split them by modality: `unknown`), and
    the per-exchange distribution of input and output tokens."""
    counted = base | {MODALITY: sc.TOKEN_MODALITY_UNKNOWN}
    for instrument, tokens in (
        (USAGE_INPUT, turn.input_tokens),
        (USAGE_OUTPUT, turn.output_tokens),
        (USAGE_CACHE_READ, turn.cached_tokens),
        (USAGE_CACHE_WRITE, turn.cache_write_tokens),
        (USAGE_REASONING, turn.reasoning_tokens),
    ):
        if tokens is not None:
            yield instrument, (tokens,), counted
    if turn.input_tokens is not None:
        yield OPERATION_INPUT, (turn.input_tokens,), base
    if turn.output_tokens is not None:
        yield OPERATION_OUTPUT, (turn.output_tokens,), base


def key_of(instrument: Instrument, labels: Mapping[Label, str | None]) -> tuple[str | None, ...]:
    """A series' key in the aggregation: its label values in the instrument's label order."""
    return tuple(labels.get(label) for label in instrument.labels)


def label_values(key: Sequence[str | None]) -> list[str]:
    """Prometheus wants every label of the instrument: an unknown value is the empty string."""
    return [value or "" for value in key]


def attributes(instrument: Instrument, key: Sequence[str | None]) -> dict[str, str]:
    """OTLP: the instrument's labels under their attribute names; an unknown value is left out."""
    return {label.attribute: value for label, value in zip(instrument.labels, key, strict=True) if value is not None}
