"""DeepSeek: the full-width token forms (R1, V3, V3.1) and the DSML form (V3.2, V4).

- R1 / V3: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{…}\\n```
  <｜tool▁call▁end｜>` per call (a newline between calls), then `<｜tool▁calls▁end｜>` (the R1 / V3 chat
  templates, vLLM's and SGLang's deepseekv3 parsers). The markup is the same for both: V3 reads it, R1
  reads it too (pinned) and is told apart only where R1 shows: it writes the markup right after closing
  its forced-open reasoning (`</think>`), R1 distills write the section opener mangled (llama.cpp's R1
  parser accepts `<｜tool_calls_begin｜>`, `<｜tool calls begin｜>`, `<｜tool\\_calls\\_begin｜>`,
  `<｜tool▁calls｜>`), and R1's own template leaves out `<｜tool▁calls▁end｜>` after a single call.
- V3.1: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>` (no type, no fence); it shares the
  section opener with V3, and what follows the separator (JSON, or a name) tells them apart.
- V3.2 / V4 DSML: `<｜DSML｜function_calls>` (V4: `<｜DSML｜tool_calls>`) holding
  `<｜DSML｜invoke name="N">` with `<｜DSML｜parameter name="k" string="true|false">v</｜DSML｜parameter>`:
  a string="true" value is the text as written, a string="false" value is JSON.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from tapfix.proxy.toolcalls.formats.base import Markup, RawCall, ToolFormat, XmlArgs, dumps, json_value, skip_ws

SECTION_OPEN = "<｜tool▁calls▁begin｜>"
SECTION_OPEN_R1 = ("<｜tool_calls_begin｜>", "<｜tool calls begin｜>", "<｜tool\\_calls\\_begin｜>", "<｜tool▁calls｜>")
SECTION_END = "<｜tool▁calls▁end｜>"
CALL_OPEN, SEP, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
_FENCE_OPEN = re.compile(r"```[ \t]*(?:json)?[ \t]*\r?\n?")
_TOKEN = "<｜"


def _section_open(text: str, at: int, openers: tuple[str, ...]) -> int:
    for opener in openers:
        if text.startswith(opener, at):
            return at + len(opener)
    raise ValueError("no DeepSeek tool-call section here")


def _after_separator(text: str, at: int) -> str:
    """The first character after the first call's separator ('' when the text doesn't reach it)."""
    sep = text.find(SEP, at, at + 400)
    if sep < 0:
        return ""
    pos = skip_ws(text, sep + len(SEP))
    return text[pos : pos + 1]


def _json_follows(text: str, at: int) -> bool:
    return _after_separator(text, at) in ("{", "[", '"')


def _fenced_call(text: str, pos: int) -> tuple[RawCall, int]:
    """`TYPE<｜tool▁sep｜>NAME\\n```json\\n{…}\\n```<｜tool▁call▁end｜>` from after the call opener."""
    sep = text.find(SEP, pos)
    if sep < 0 or "\n" in text[pos:sep] or _TOKEN in text[pos:sep]:
        raise ValueError("no call type")
    line_end = text.find("\n", sep)
    if line_end < 0:
        raise ValueError("call name not finished")
    name = text[sep + len(SEP) : line_end].strip()
    if not name or _TOKEN in name:
        raise ValueError("no call name")
    pos = skip_ws(text, line_end)
    fence = _FENCE_OPEN.match(text, pos)
    if fence is not None:
        pos = fence.end()
    args, pos = json_value(text, pos)
    pos = skip_ws(text, pos)
    if fence is not None:
        if not text.startswith("```", pos):
            raise ValueError("fence not closed")
        pos = skip_ws(text, pos + 3)
    if not text.startswith(CALL_END, pos):
        raise ValueError("call not closed")
    return (name, args), pos + len(CALL_END)


def _bare_call(text: str, pos: int) -> tuple[RawCall, int]:
    """`NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>` from after the call opener (V3.1)."""
    sep = text.find(SEP, pos)
    name = text[pos:sep].strip() if sep >= 0 else ""
    if not name or "\n" in name or _TOKEN in name:
        raise ValueError("no call name")
    args, pos = json_value(text, sep + len(SEP))
    pos = skip_ws(text, pos)
    if not text.startswith(CALL_END, pos):
        raise ValueError("call not closed")
    return (name, args), pos + len(CALL_END)


class _TokenSection(ToolFormat):
    """A `<｜tool▁calls▁begin｜>` section of calls; subclasses say how one call reads and renders."""

    section_openers: ClassVar[tuple[str, ...]] = (SECTION_OPEN,)
    end_optional: ClassVar[bool] = False  # R1's template leaves the section end out after one call

    def read_call(self, text: str, pos: int) -> tuple[RawCall, int]:
        raise NotImplementedError

    def parse(self, text: str, at: int) -> Markup | None:
        pos = _section_open(text, at, self.section_openers)
        calls: list[RawCall] = []
        last_end = pos
        while True:
            pos = skip_ws(text, pos)
            if not text.startswith(CALL_OPEN, pos):
                break
            call, pos = self.read_call(text, pos + len(CALL_OPEN))
            calls.append(call)
            last_end = pos
        if not calls:
            if pos >= len(text) or CALL_OPEN.startswith(text[pos:]):
                raise ValueError("section cut before its first call")
            return None
        if text.startswith(SECTION_END, pos):
            return Markup(at, pos + len(SECTION_END), calls)
        return Markup(at, last_end, calls, closed=self.end_optional and pos < len(text))


class DeepSeekV3(_TokenSection):
    name = "deepseek_v3"
    family = "DeepSeek V3, V3-0324, R1-0528 (deepseekv3 parser)"
    openers: tuple[str, ...] = (SECTION_OPEN,)

    def claims(self, text: str, at: int) -> bool:
        # R1 writes the markup right after closing its reasoning; V3.1's separator is followed by JSON.
        return not text[max(0, at - 64) : at].rstrip().endswith("</think>") and not _json_follows(text, at)

    def read_call(self, text: str, pos: int) -> tuple[RawCall, int]:
        return _fenced_call(text, pos)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        body = "\n".join(f"{CALL_OPEN}function{SEP}{n}\n```json\n{dumps(a)}\n```{CALL_END}" for n, a in calls)
        return f"{SECTION_OPEN}{body}{SECTION_END}"


class DeepSeekR1(DeepSeekV3):
    name = "deepseek_r1"
    family = "DeepSeek R1 and its distills"
    openers = (SECTION_OPEN, *SECTION_OPEN_R1)
    section_openers = openers
    end_optional = True

    def claims(self, text: str, at: int) -> bool:
        return not _json_follows(text, at)


class DeepSeekV31(_TokenSection):
    name = "deepseek_v31"
    family = "DeepSeek V3.1"
    openers = (SECTION_OPEN,)

    def claims(self, text: str, at: int) -> bool:
        return _after_separator(text, at) in ("", "{", "[", '"')

    def read_call(self, text: str, pos: int) -> tuple[RawCall, int]:
        return _bare_call(text, pos)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        body = "".join(f"{CALL_OPEN}{n}{SEP}{dumps(a)}{CALL_END}" for n, a in calls)
        return f"{SECTION_OPEN}{body}{SECTION_END}"


DSML = "｜DSML｜"
_INVOKE = re.compile(rf'<{DSML}invoke\s+name="([^"]+)"\s*>')
_PARAM = re.compile(rf'<{DSML}parameter\s+name="([^"]+)"(?:\s+string="(true|false)")?\s*>')
_PARAM_END, _INVOKE_END = f"</{DSML}parameter>", f"</{DSML}invoke>"


def _typed_value(raw: str) -> Any:
    """A string="false" value: JSON, read whole, or not a call."""
    value, end = json_value(raw, 0)
    if raw[end:].strip():
        raise ValueError('a string="false" value that isn\'t one JSON value')
    return value


class DeepSeekDsml(ToolFormat):
    """`<｜DSML｜function_calls>` (V3.2); V4 names the block `tool_calls`."""

    name = "deepseek_v32_dsml"
    family = "DeepSeek V3.2"
    block: ClassVar[str] = "function_calls"
    openers = (f"<{DSML}function_calls>",)

    def parse(self, text: str, at: int) -> Markup | None:
        opener, closer = f"<{DSML}{self.block}>", f"</{DSML}{self.block}>"
        if not text.startswith(opener, at):
            return None
        pos = at + len(opener)
        calls: list[RawCall] = []
        while True:
            pos = skip_ws(text, pos)
            invoke = _INVOKE.match(text, pos)
            if invoke is None:
                break
            call, pos = self._invoke(text, invoke)
            calls.append(call)
        if text.startswith(closer, pos):
            return Markup(at, pos + len(closer), calls) if calls else None
        if pos >= len(text) and calls:
            return Markup(at, len(text), calls, closed=False)
        raise ValueError("DSML block not closed") if pos >= len(text) else ValueError("not a DSML call")

    def _invoke(self, text: str, invoke: re.Match[str]) -> tuple[RawCall, int]:
        typed: dict[str, Any] = {}
        raw: dict[str, str] = {}
        marked = False
        pos = invoke.end()
        while True:
            pos = skip_ws(text, pos)
            param = _PARAM.match(text, pos)
            if param is None:
                break
            end = text.find(_PARAM_END, param.end())
            if end < 0:
                raise ValueError("parameter not closed")
            key, value = param.group(1), text[param.end() : end]
            raw[key] = value
            if param.group(2) is not None:
                marked = True
            typed[key] = _typed_value(value) if param.group(2) == "false" else value
            pos = end + len(_PARAM_END)
        if not text.startswith(_INVOKE_END, pos):
            raise ValueError("invoke not closed")
        args: Any = typed if marked else XmlArgs(raw)
        return (invoke.group(1), args), pos + len(_INVOKE_END)

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        out = [f"\n\n<{DSML}{self.block}>\n"]
        for name, args in calls:
            out.append(f'<{DSML}invoke name="{name}">\n')
            for key, value in args.items():
                if isinstance(value, str):
                    out.append(f'<{DSML}parameter name="{key}" string="true">{value}{_PARAM_END}\n')
                else:
                    out.append(f'<{DSML}parameter name="{key}" string="false">{dumps(value)}{_PARAM_END}\n')
            out.append(self.empty_args if not args else "")
            out.append(f"{_INVOKE_END}\n")
        out.append(f"</{DSML}{self.block}>")
        return "".join(out)

    empty_args: ClassVar[str] = ""


class DeepSeekV4(DeepSeekDsml):
    name = "deepseek_v4"
    family = "DeepSeek V4, V4 Flash"
    block = "tool_calls"
    openers = (f"<{DSML}tool_calls>",)
    empty_args = "\n"  # V4's template writes a newline inside an invoke without parameters
