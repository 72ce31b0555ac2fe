"""Streamed and non-streamed tool-call repair for OpenAI Chat Completions.

`ChatToolCallRepair` is an incremental `feed(event)/flush()` stage over whole raw SSE events (as
`SSESplitter` yields them); `repair_chat_completion` applies the same rules to a non-streamed body.
"""

from .accumulate import assemble_tool_calls
from .nonstream import repair_chat_completion
from .stage import ChatToolCallRepair

__all__ = ["ChatToolCallRepair", "assemble_tool_calls", "repair_chat_completion"]
