"""HTTP heads as the proxy sees them: which headers frame one connection, and how a head's raw bytes
are kept as text.

Header names that describe one connection's framing, not the message (RFC 9110 §7.6.1 and kin):
resending, exporting or replaying a captured message must drop them, the new connection frames the
bytes itself.

mitmproxy hands header values and paths as `str`, with each byte that isn't UTF-8 as a lone
surrogate (Python's `surrogateescape`), which neither SQLite nor JSON accept. The store keeps them as
text with `\\xNN` for each such byte and `\\\\` for a literal backslash (everything else as is), so
valid UTF-8 reads as itself and `head_bytes` gives back the exact bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}
)
# The headers an agent names its session with, first found wins (store/sessions.py): opencode's, then
# Claude Code's (on every request it sends, its subagents' too). Lower case. No secret (exports keep
# them); a replay's own record leaves them out (they would file the copy under the original session).
SESSION_HEADERS = ("x-session-id", "x-claude-code-session-id")
_ESCAPE = re.compile(rb"\\(\\|x[0-9a-fA-F]{2})")


def head_text(value: str) -> str:
    """A header value, name or path from mitmproxy as storable text (see the module docstring)."""
    if value.isascii() and "\\" not in value:
        return value
    try:
        raw = value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no byte stands for: keep its UTF-8-like bytes, escaped
        raw = value.encode("utf-8", "surrogatepass")
    return raw.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")


def head_bytes(text: str) -> bytes:
    """The exact bytes behind `head_text`'s text."""
    raw = text.encode("utf-8", "surrogateescape")
    if b"\\" not in raw:
        return raw
    return _ESCAPE.sub(lambda m: b"\\" if m.group(1) == b"\\" else bytes([int(m.group(1)[1:], 16)]), raw)


def folded(fields: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """A head's raw fields as the plain dict `dict(headers.items())` of mitmproxy's `Headers` gives, in one pass:
    each name as first spelt, case-insensitively, its values joined with ", ", names and values decoded as
    mitmproxy decodes them (UTF-8, other bytes as surrogates). Why: that `items()` looks every name up again
    in the multidict (~40 µs per request head, issue 34)."""
    out: dict[str, str] = {}
    spelt: dict[bytes, str] = {}
    for raw_name, raw_value in fields:
        value = raw_value.decode("utf-8", "surrogateescape")
        key = raw_name.lower()
        name = spelt.get(key)
        if name is None:
            spelt[key] = name = raw_name.decode("utf-8", "surrogateescape")
            out[name] = value
        else:
            out[name] = f"{out[name]}, {value}"
    return out
