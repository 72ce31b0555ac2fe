"""Meituan LongCat-Flash: `<longcat_tool_call>\n{"name": ..., "arguments": {...}}\n</longcat_tool_call>`.

Hermes' JSON object under LongCat's own tag (vLLM's longcat parser is the hermes parser with these tags);
one block per call.
"""

from __future__ import annotations

from tapfix.proxy.toolcalls.formats.tagged import TaggedJson

LONGCAT = TaggedJson(
    "longcat",
    "Meituan LongCat-Flash",
    "<longcat_tool_call>",
    "</longcat_tool_call>",
    block="{opener}\n{call}\n{closer}",
    joiner="\n",
)
