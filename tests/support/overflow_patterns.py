"""The agents' context-overflow patterns, as facts from their source: opencode
`packages/opencode/src/provider/error.ts` (OVERFLOW_PATTERNS, adapted from pi's) and pi
`packages/ai/src/utils/overflow.ts` (OVERFLOW_PATTERNS). A subset: the ones tapfix's texts can match."""

from __future__ import annotations

import re

OPENCODE = [
    r"prompt is too long",
    r"exceeds the context window",
    r"maximum context length is \d+ tokens",
    r"exceeds the available context size",
    r"context[_ ]length[_ ]exceeded",
    r"reduce the length of the messages",
]
PI = [
    r"prompt is too long",
    r"exceeds the context window",
    r"reduce the length of the messages",
    r"maximum context length is \d+ tokens",
    r"exceeds the available context size",
    r"context[_ ]length[_ ]exceeded",
]


def agents_recognise(message: str) -> bool:
    return all(any(re.search(p, message, re.I) for p in patterns) for patterns in (OPENCODE, PI))
