"""ByteDance Seed-OSS: `<seed:tool_call>\n<function=NAME>\n<parameter=k>v</parameter>\n</function>\n</seed:tool_call>`.

One block per call. The template writes a string value as is and anything else through Jinja's `string`
filter, i.e. as a Python literal (`True`, `['a', 'b']`): the schema types it later. The template writes
`<parameter=k>` + value + `</parameter>`; a value the model puts on lines of its own (`>\nv\n</`) loses
those two newlines, as in vLLM's seed_oss parser, and one ending in a newline only (code) keeps it.
"""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.formats.base import FUNCTION_XML, Markup, ToolFormat, frame, open_markup, skip_ws

OPEN, CLOSE = "<seed:tool_call>", "</seed:tool_call>"
NL = "\n"


class SeedOSS(ToolFormat):
    name = "seed_oss"
    family = "ByteDance Seed-OSS"
    openers = (OPEN,)

    def parse(self, text: str, at: int) -> Markup | None:
        calls: list[tuple[str | None, Any]] = []
        pos = end = at
        while text.startswith(OPEN, pos):
            read = FUNCTION_XML.read(text, at, skip_ws(text, pos + len(OPEN)), calls)
            if not isinstance(read, tuple):
                return read
            call, pos = read
            calls.append(call)
            pos = skip_ws(text, pos)
            if not text.startswith(CLOSE, pos):
                return open_markup(at, text, calls) if CLOSE.startswith(text[pos:]) else None
            end = pos + len(CLOSE)
            pos = skip_ws(text, end)
        return Markup(at, end, calls) if calls else None

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        return "\n".join(f"{OPEN}\n{FUNCTION_XML.write(n, a, _value, newline=NL)}{NL}{CLOSE}" for n, a in calls)


def _value(value: Any) -> str:
    return frame(value) if isinstance(value, str) else str(value)
