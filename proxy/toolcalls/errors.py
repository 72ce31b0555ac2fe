"""The error event that replaces a tool call tapfix cannot recover.

Agents decide to retry from the error's words alone (clients.md §8): "error" policy carries all three
retry signals (server-error words, numeric 5xx code, "server error" in the message) so opencode, omp
and pi regenerate the turn; "fail_fast" carries none of them, in any field, so every agent stops.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tapfix.proxy.sse import format_event
from tapfix.proxy.toolcalls.plan import Fatal

REASON = "tool_call_unrecoverable"
# What opencode, omp and pi read as "transient, retry": kept out of every fail_fast field.
_TRANSIENT = re.compile(
    r"server[ _]error|unavailable|timeout|timed out|internal|overloaded|exhausted|terminated|try again|"
    r"connection|network|fetch failed|upstream connect|rate limit|429|5\d\d",
    re.I,
)


def error_body(fatal: Fatal, policy: str, capture_id: str) -> dict[str, Any]:
    tapfix: dict[str, Any] = {"reason": REASON, "capture_id": capture_id, "defect": fatal.kind}
    if policy == "fail_fast":
        name = fatal.name if not _TRANSIENT.search(fatal.name) else "?"
        reason = fatal.reason if not _TRANSIENT.search(fatal.reason) else "arguments could not be recovered"
        if _TRANSIENT.search(capture_id):
            del tapfix["capture_id"]  # an id like "c502" would read as a 502 to opencode
        return {
            "error": {
                "message": f"tapfix could not recover tool call '{name}': {reason}",
                "type": REASON,
                "code": REASON,
                "tapfix": tapfix,
            }
        }
    return {
        "error": {
            "message": f"upstream server error: tapfix could not recover tool call '{fatal.name}' "
            f"({fatal.reason})",
            "type": "server_error",
            "code": 502,
            "tapfix": tapfix,
        }
    }


def error_event(fatal: Fatal, policy: str, capture_id: str, newline: bytes = b"\n") -> bytes:
    return format_event(
        json.dumps(error_body(fatal, policy, capture_id), ensure_ascii=False).encode(), newline
    )


def passthrough_note(fatal: Fatal) -> str:
    reason = fatal.reason.replace("\n", " ").replace("\r", " ")
    return f"tapfix: could not recover tool call '{fatal.name}' ({reason}); passed through unchanged"
