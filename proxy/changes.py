"""Every change tapfix makes to traffic, recorded beside the original (design invariant 2)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

# The part of tapfix that made a change: `captures show` and the browser group changes by it.
# "request": a part of the client's request that defeats the engine, removed (Claude Code's billing line).
# "telemetry": the `traceparent` tapfix forwards for its own span while OTLP export is on.
Stage = Literal[
    "router",
    "policy",
    "request",
    "sampling",
    "reasoning",
    "reasoning_field",
    "toolcalls",
    "framing",
    "stream",
    "telemetry",
    "window",
]


@dataclass(slots=True)
class Change:
    stage: Stage
    kind: str  # "inject", "override", "clamp", "drop", "rename", "repair", "detect", ...
    path: str  # JSON path of what changed, e.g. "$.temperature" or "$.choices[0].tool_calls[1]"
    before: Any = None
    after: Any = None
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
