"""Claude Code's billing block, removed before a local engine sees it.

Claude Code (2.1.29 and later) sends `x-anthropic-billing-header: cc_version=…; cc_entrypoint=…; cch=…;` as the
first system block. Only Anthropic's own API reads it, and its value changes between requests (`cch`) or
between sessions (`cc_version`'s suffix), so on an engine with a prefix cache everything after byte 0 is
prefilled again each time (claude-code #68900, #24168, #40652; vllm-mlx PR #277 measured 13.7x on a 60k-token
prompt). A block is the billing line only when its whole text is that one line: a user's text that mentions
the header, or a block with more in it, stays. Gateways that turn Messages into chat completions carry the
block as a system (or developer) message's text part, so the chat surface is read the same way.

The block is cut out of the client's bytes (`jsonsplice.remove_items`): nothing else of the body changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tapfix.proxy.changes import Change
from tapfix.proxy.jsonsplice import remove_items
from tapfix.proxy.surfaces import Surface, api_surface

HEADER = "x-anthropic-billing-header:"
# Engines that serve from the user's own prefix cache; an unknown engine, `openai` or `anthropic` may be a
# hosted API that reads the header (Claude Code's subscription traffic is recognised by it), so it stays.
LOCAL_ENGINES = frozenset({"vllm", "sglang", "llamacpp", "ollama", "tabbyapi"})
_SYSTEM_ROLES = ("system", "developer")
REASON = "Claude Code's billing line changes between requests and would defeat the local engine's prefix cache"


def strips_for(engine: str | None, keep_billing_line: bool) -> bool:
    """Whether a request to this engine loses the block: a known local engine, unless the model keeps it."""
    return engine in LOCAL_ENGINES and not keep_billing_line


def is_billing_line(text: object) -> bool:
    """The whole text is one header line (a line break at its end allowed, none inside)."""
    if not isinstance(text, str) or not text.startswith(HEADER):
        return False
    line = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    return "\n" not in line and "\r" not in line


@dataclass(frozen=True, slots=True)
class BillingBlock:
    array: tuple[str | int, ...]  # the array holding it: ("system",), ("messages", 0, "content"), ("messages",)
    index: int
    text: str

    @property
    def path(self) -> str:
        return "$" + "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in (*self.array, self.index))


def billing_blocks(parsed: dict[str, Any], surface: Surface | None) -> list[BillingBlock]:
    """Where the request holds the block: Messages' `system` blocks; on chat, a system or developer message's
    text parts (a message that is nothing but the line goes whole)."""
    found: list[BillingBlock] = []
    api = api_surface(surface)
    if api.typed_content and api.instructions is not None:  # Messages: `system` is typed text blocks
        system = parsed.get(api.instructions)
        if isinstance(system, list):
            found += [BillingBlock((api.instructions,), i, b["text"]) for i, b in enumerate(system) if _is_block(b)]
    elif api.turns and api.instructions is None:  # chat: system and developer messages
        messages = parsed.get("messages")
        for i, m in enumerate(messages if isinstance(messages, list) else []):
            if not isinstance(m, dict) or m.get("role") not in _SYSTEM_ROLES:
                continue
            content = m.get("content")
            if isinstance(content, str) and is_billing_line(content):
                found.append(BillingBlock(("messages",), i, content))
            elif isinstance(content, list) and content:
                parts = [
                    BillingBlock(("messages", i, "content"), j, p["text"])
                    for j, p in enumerate(content)
                    if _is_block(p)
                ]
                whole = len(parts) == len(content)
                found += [BillingBlock(("messages",), i, "".join(p.text for p in parts))] if whole else parts
    return found


@dataclass(frozen=True, slots=True)
class Stripped:
    body: bytes
    parsed: dict[str, Any]  # what `body` parses to
    changes: list[Change]


def strip_billing_blocks(body: bytes, parsed: dict[str, Any], surface: Surface | None) -> Stripped | None:
    """The body without the billing blocks, what it parses to, and a change per block; None: there are none.
    Raises jsonsplice.SpliceError when the bytes are not the object parsed (the caller's bug to flag)."""
    blocks = billing_blocks(parsed, surface)
    if not blocks:
        return None
    expected = dict(parsed)
    by_array: dict[tuple[str | int, ...], list[int]] = {}
    for b in blocks:
        by_array.setdefault(b.array, []).append(b.index)
    for array, indices in sorted(by_array.items(), key=lambda a: -len(a[0])):  # inner arrays first: indices hold
        body = remove_items(body, array, indices)
        _remove(expected, array, set(indices))
    changes = [Change("request", "strip_billing_line", b.path, b.text, None, REASON) for b in blocks]
    return Stripped(body, expected, changes)


def _is_block(value: object) -> bool:
    return isinstance(value, dict) and value.get("type") == "text" and is_billing_line(value.get("text"))


def _remove(obj: dict[str, Any], array: tuple[str | int, ...], indices: set[int]) -> None:
    """The parsed side of `remove_items`: copies along the path, so the client's parse stays as it came."""
    node: Any = obj
    *parents, last = array
    for step in parents:
        child = node[step]
        node[step] = child = dict(child) if isinstance(child, dict) else list(child)
        node = child
    node[last] = [v for i, v in enumerate(node[last]) if i not in indices]
