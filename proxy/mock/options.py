"""What the CLI hands to the mock: plain dataclasses, so the lead can build them from flags or the store."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_MODEL = "tapfix-mock"


@dataclass(frozen=True)
class RecordedResponse:
    """One upstream response as the store captured it, for server-side replay.

    `chunks` are (seconds since the request started, raw bytes) in arrival order; the mock sends
    exactly these bytes, at these offsets unless `MockOptions.fast` is set.
    """

    status: int
    headers: list[tuple[str, str]]
    chunks: list[tuple[float, bytes]]


@dataclass
class MockOptions:
    """Everything `tapfix mock` can be told.

    cases:          corpus case files served on /v1/chat/completions (by model name, else in turn)
    scenario:       a scenario JSON file (rules evaluated per request; see docs/mock.md)
    chunk_delay_ms: pause before each SSE event after the first (paces streams like a real GPU)
    recorded:       replay this captured response for every request, byte for byte
    fast:           ignore recorded timing (send everything at once)
    models:         model ids served when neither cases nor a scenario name them (default tapfix-mock)
    context_window: play a vLLM with this max_model_len (window.py): /tokenize, and its 400s for what won't fit
    """

    cases: list[Path] = field(default_factory=list)
    scenario: Path | None = None
    chunk_delay_ms: float = 0
    recorded: RecordedResponse | None = None
    fast: bool = False
    models: list[str] | None = None
    context_window: int | None = None
