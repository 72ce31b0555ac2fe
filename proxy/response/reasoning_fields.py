"""Rename the reasoning-text field of responses so a client that reads only one name sees it.

vLLM and Ollama `/v1` send `reasoning`; SGLang, llama.cpp and TabbyAPI send `reasoning_content`
(engines.md §4). opencode replays history as `reasoning_content`, omp/pi in the field that arrived,
and some templates read only `reasoning_content` back. This stage renames the key in
`choices[*].delta` (streams) or `choices[*].message` (whole bodies), byte for byte elsewhere.
An event without the field is returned as the same object after one substring check.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.sse import event_data

FIELDS = ("reasoning", "reasoning_content")
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.S)
_COLON = re.compile(rb"[ \t\r\n]*:")


class ReasoningFieldRename:
    """Streaming stage: `feed(event) -> [event]`, `flush() -> []`; events as `SSESplitter` yields them."""

    def __init__(self, src: str, dst: str) -> None:
        if src not in FIELDS or dst not in FIELDS or src == dst:
            raise ValueError(f"expected two different fields of {FIELDS}, got {src!r} → {dst!r}")
        self.src, self.dst = src, dst
        self._needle = f'"{src}"'.encode()
        self.renamed = 0  # events changed

    def feed(self, event: bytes) -> list[bytes]:
        if event.find(self._needle) < 0:  # `in` on bytes costs ~0.4 µs a test (proxy/sse.py)
            return [event]
        data = event_data(event)
        if data is None:
            return [event]
        new = rename_field(data, self.src, self.dst)
        if new is data or event.find(data) < 0:  # multi-line data: left as is (no engine sends it)
            return [event]
        self.renamed += 1
        return [event.replace(data, new, 1)]

    def flush(self) -> list[bytes]:
        return []

    def rename_body(self, body: bytes) -> tuple[bytes, Change | None]:
        """A whole (non-streamed) body: `choices[*].message`; the same object and no change when untouched."""
        new = rename_field(body, self.src, self.dst)
        if new is body:
            return body, None
        path = f"$.choices[*].message.{self.src}"
        return new, Change("reasoning_field", "rename", path, self.src, self.dst, f"client reads {self.dst}")

    def change(self) -> Change | None:
        """One summary change for the capture (one per event would drown the list)."""
        if not self.renamed:
            return None
        return Change(
            "reasoning_field",
            "rename",
            f"$.choices[*].delta.{self.src}",
            self.src,
            self.dst,
            f"client reads {self.dst}; {self.renamed} events renamed",
        )


def rename_field(data: bytes, src: str, dst: str) -> bytes:
    """`data` with the `src` key of each choice's delta/message renamed to `dst`.

    Returns the same object when nothing changes: the field is absent, the JSON is not a
    chat-completion object, or a choice already carries `dst` (the client sees that one).
    """
    needle = f'"{src}"'.encode()
    if data.find(needle) < 0:
        return data
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data
    targets = _targets(obj, src)
    if not targets or any(dst in t for t in targets):
        return data
    wanted = len(targets)
    spans = []
    for m in _STRING.finditer(data):
        if m.group() == needle and _COLON.match(data, m.end()):
            spans.append(m.span())
    if len(spans) != wanted:
        return data  # the key also appears elsewhere (an unexpected shape): leave it alone
    replacement = f'"{dst}"'.encode()
    out = bytearray()
    pos = 0
    for start, end in spans:
        out += data[pos:start] + replacement
        pos = end
    out += data[pos:]
    return bytes(out)


def _targets(obj: Any, src: str) -> list[dict[str, Any]]:
    if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list):
        return []
    found = []
    for choice in obj["choices"]:
        if isinstance(choice, dict):
            for part in ("delta", "message"):
                inner = choice.get(part)
                if isinstance(inner, dict) and src in inner:
                    found.append(inner)
    return found
