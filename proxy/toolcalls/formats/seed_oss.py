"""ByteDance Seed-OSS: `<seed:tool_call>\n<function=NAME>\n<parameter=k>v</parameter>\n</function>\n</seed:tool_call>`.

One block per call. The template writes a string value as is and anything else through Jinja's `string`
filter, i.e. as a Python literal (`True`, `['a', 'b']`): the schema types it later. The template writes
`<parameter=k>` + value + `</parameter>`; a value the model puts on lines of its own (`>\nv\n</`) loses
those two newlines, as in vLLM's seed_oss parser, and one ending in a newline only (code) keeps it.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.base import Markup, ToolFormat, XmlArgs, frame, open_markup, skip_ws, unframe

OPEN, CLOSE = "<seed:tool_call>", "</seed:tool_call>"
FN_OPEN, FN_CLOSE = "<function=", "</function>"
PARAM_OPEN, PARAM_CLOSE = "<parameter=", "</parameter>"


class SeedOSS(ToolFormat):
    name = "seed_oss"
    family = "ByteDance Seed-OSS"
    openers = (OPEN,)

    def parse(self, text: str, at: int) -> Markup | None:
        calls: list[tuple[str | None, Any]] = []
        pos = end = at
        while text.startswith(OPEN, pos):
            pos = skip_ws(text, pos + len(OPEN))
            if not text.startswith(FN_OPEN, pos):
                return open_markup(at, text, calls) if FN_OPEN.startswith(text[pos:]) else None
            name, pos = _tag_name(text, pos + len(FN_OPEN))
            args = XmlArgs()
            pos = skip_ws(text, pos)
            while text.startswith(PARAM_OPEN, pos):
                key, pos = _tag_name(text, pos + len(PARAM_OPEN))
                value_end = text.find(PARAM_CLOSE, pos)
                if value_end < 0:
                    return open_markup(at, text, calls)
                args[key] = unframe(text[pos:value_end])
                pos = skip_ws(text, value_end + len(PARAM_CLOSE))
            if not text.startswith(FN_CLOSE, pos):
                return open_markup(at, text, calls) if FN_CLOSE.startswith(text[pos:]) else None
            calls.append((name, args))
            pos = skip_ws(text, pos + len(FN_CLOSE))
            if not text.startswith(CLOSE, pos):
                return open_markup(at, text, calls) if CLOSE.startswith(text[pos:]) else None
            end = pos + len(CLOSE)
            pos = skip_ws(text, end)
        return Markup(at, end, calls) if calls else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        blocks = []
        for name, args in calls:
            params = "".join(
                f"{PARAM_OPEN}{k}>{frame(v) if isinstance(v, str) else str(v)}{PARAM_CLOSE}\n" for k, v in args.items()
            )
            blocks.append(f"{OPEN}\n{FN_OPEN}{name}>\n{params}{FN_CLOSE}\n{CLOSE}")
        return "\n".join(blocks)


def _tag_name(text: str, pos: int) -> tuple[str, int]:
    end = text.find(">", pos)
    if end < 0:
        raise ValueError("a tag is cut")
    name = text[pos:end].strip()
    if not name or "\n" in name or "<" in name:
        raise ValueError("not a tag name")
    return name, end + 1
