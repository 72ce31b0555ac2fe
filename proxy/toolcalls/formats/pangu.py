"""openPangu: `[unused11][{"name": N, "arguments": {…}}, …][unused12]`.

openPangu's tool prompt and the Pangu tool parsers (vLLM-Ascend, omni_npu) read a JSON list of calls
(or one call) between its reserved tokens `[unused11]` and `[unused12]`. Its thinking runs between
`[unused16]` and `[unused17]`; markup there is thinking, not a call.
"""

from __future__ import annotations

from tapfix.proxy.toolcalls.formats.tagged import TaggedJson

PANGU = TaggedJson(
    "pangu",
    "openPangu",
    "[unused11]",
    "[unused12]",
    thinking=("[unused16]", "[unused17]"),
    trailer="[unused10]",  # openPangu's end of turn: a token, never text
)
