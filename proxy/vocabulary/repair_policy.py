"""What tapfix does with a streamed tool call it can't recover (`tapfix run --tool-repair`, the config's
`[tool_repair] mode`): a retryable error agents regenerate the turn on (`error`), a permanent-looking one
(`fail_fast`), the broken call as it came (`passthrough`), or no tool-call stage at all (`off`).

The word the settings, the repair stages, regeneration and the error shapes share, so it lives below all
of them: a module that needs the word imports nothing else for it.
"""

from __future__ import annotations

from typing import Literal, get_args

ToolRepairPolicy = Literal["error", "fail_fast", "passthrough", "off"]
TOOL_REPAIR_POLICIES: tuple[ToolRepairPolicy, ...] = get_args(ToolRepairPolicy)
