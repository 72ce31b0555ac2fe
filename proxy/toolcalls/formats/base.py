"""What a tool-call format is: how its markup starts, how to tell it from formats sharing an opener,
how to read calls back out of text, and how the model writes them (for vectors and the defect model).

When a server runs without the right tool parser (or its parser gives up) the model's own markup
arrives as text. Each format family is one small module in this package; `registry.py` collects them.
A format reads markup only: whether a call is offered, inside a decoy (`<think>`, prose, a fence) or in
the reasoning field is decided once, for every format, in `registry.py`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

# A call as the markup holds it: its name (None for a format that carries none) and its arguments,
# as a dict (JSON or Python-literal markup), a JSON text, or `XmlArgs` (untyped parameter text the
# offered tool's schema types later).
RawCall = tuple[str | None, Any]


class XmlArgs(dict[str, str]):
    """Raw parameter text from XML-style markup; typed against the schema later (a string stays a string)."""


@dataclass(slots=True)
class Markup:
    start: int  # where the format's markup starts in the text
    end: int  # where it ends (what follows is ordinary text)
    calls: list[RawCall] = field(default_factory=list)
    closed: bool = True  # the format's end marker (or a whole value, for a format without one) was seen


class ToolFormat:
    """One format; subclasses set the class attributes and implement `parse` and `render`."""

    name: str = ""  # the registry key, also what `--tool-format` and `tool_format =` take
    family: str = ""  # the model family, as docs and the table of truth show it
    # Other names that pin this format: a family whose templates render another family's markup
    # (Poolside's Laguna writes GLM's). Pinning an alias arms every format that declares it.
    aliases: ClassVar[tuple[str, ...]] = ()
    openers: tuple[str, ...] = ()  # literal text that starts this format's markup
    anchored: ClassVar[bool] = False  # no marker (Llama 3 JSON, pythonic lists): only at the start of content
    fence: ClassVar[bool] = False  # the call syntax is a fenced block (``` tool_code)

    def claims(self, text: str, at: int) -> bool:
        """Whether the markup at `at` (where one of `openers` matched) is this format's, when formats
        share an opener (`<tool_call>` opens hermes, Qwen3-Coder XML and GLM alike): look at what follows."""
        return True

    def parse(self, text: str, at: int) -> Markup | None:
        """The calls of the markup starting at `at`; None when the text there is not this format."""
        raise NotImplementedError

    def render(self, calls: list[tuple[str, dict[str, Any]]]) -> str:
        """The markup a model of this family writes for `calls` (as its chat template renders them)."""
        raise NotImplementedError


class Extractor:
    """Incremental: fed with deltas, reads the markup again only when a delta may have completed it.

    Formats are small and calls arrive whole at the end of a message, so re-reading the buffered text
    when a delta carries a closing character is linear in practice; `closers` says which characters
    can complete a call of the format (default: any of `>]}` and a newline)."""

    closers: ClassVar[str] = ">]}\n|"

    def __init__(self, fmt: ToolFormat, at: int = 0) -> None:
        self.fmt = fmt
        self.text = ""
        self.at = at
        self.markup: Markup | None = None

    def feed(self, delta: str) -> Markup | None:
        self.text += delta
        if any(c in delta for c in self.closers):
            self.markup = self.fmt.parse(self.text, self.at)
        return self.markup

    def finish(self) -> Markup | None:
        self.markup = self.fmt.parse(self.text, self.at)
        return self.markup


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def inside(text: str, at: int, opener: str, closer: str) -> bool:
    """Whether `at` lies in an opened, not yet closed `opener…closer` span (a family's own thinking
    or plan markers, whose markup is a decoy)."""
    opened = text.rfind(opener, 0, at)
    return opened >= 0 and text.find(closer, opened, at) < 0


def skip_ws(text: str, pos: int) -> int:
    n = len(text)
    while pos < n and text[pos] in " \t\r\n":
        pos += 1
    return pos


def json_value(text: str, pos: int) -> tuple[Any, int]:
    """A JSON (or JSON-ish: Python literals, single quotes) value at `pos` and where it ends.

    Strict first; the tolerant reader only for text that fails it, and never a value it had to cut or
    close: markup is read as the model wrote it or not at all. ValueError when there is none."""
    from tapfix.proxy.toolcalls.jsonfix import MISSING, loads_tolerant

    pos = skip_ws(text, pos)
    try:
        value, end = _DECODER.raw_decode(text, pos)
        return value, end
    except ValueError:
        pass
    parsed = loads_tolerant(text[pos:])
    if parsed.value is MISSING or parsed.cut or parsed.bad or parsed.closed:
        raise ValueError("no JSON value")
    return parsed.value, len(text) - len(parsed.rest)


_DECODER = json.JSONDecoder()


def named_call(item: Any) -> RawCall:
    """`{"name": N, "arguments": A}` (or `parameters`, or nested under `function`) as a call."""
    if not isinstance(item, dict):
        raise ValueError("a call is an object")
    fn = item["function"] if isinstance(item.get("function"), dict) else item
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("a call has a name")
    args = fn.get("arguments", fn.get("parameters", {}))
    if args is None:
        args = {}
    return name, args


def json_calls(value: Any) -> list[RawCall]:
    """One named call, or a JSON list of them (how most list formats write theirs)."""
    return [named_call(item) for item in (value if isinstance(value, list) else [value])]


def named_json(calls: list[tuple[str, dict[str, Any]]], key: str = "arguments") -> list[dict[str, Any]]:
    """Calls as the `{"name": N, "arguments": A}` objects most JSON formats write (`key`: their name for A)."""
    return [{"name": n, key: a} for n, a in calls]


def closed_by(text: str, at: int, pos: int, closer: str, calls: list[RawCall], trailer: str = "") -> Markup | None:
    """Markup whose calls were read up to `pos`: closed by `closer` there (white space between, and a
    `trailer` token after it taken along), open when the text ends there, not this format otherwise."""
    pos = skip_ws(text, pos)
    if not text.startswith(closer, pos):
        return Markup(at, len(text), calls, closed=False) if pos >= len(text) else None
    pos += len(closer)
    return Markup(at, pos + len(trailer) if trailer and text.startswith(trailer, pos) else pos, calls)


def json_list(text: str, at: int, pos: int) -> Markup | None:
    """A JSON list of named calls at `pos` that ends the markup: no end marker (Granite 3, `functools[`)."""
    items, end = json_value(text, pos)
    if not isinstance(items, list):
        return None
    calls = [named_call(item) for item in items]
    return Markup(at, end, calls) if calls else None


def quoted_attr(text: str, pos: int) -> tuple[str, int]:
    """The value of a `name="…"` attribute whose text starts at `pos`, and where its tag ends (`">`)."""
    end = text.find('">', pos)
    if end < 0 or "\n" in text[pos:end]:
        raise ValueError("a name attribute is cut")
    return text[pos:end], end + 2


def xml_params(
    text: str, pos: int, opener: str, closer: str, key_at: Callable[[str, int], tuple[str, int]]
) -> tuple[XmlArgs, int] | None:
    """`opener KEY … > value closer` parameters back to back from `pos` (a value on lines of its own loses
    those two newlines), and where they end; None when the text ends inside a value."""
    args = XmlArgs()
    pos = skip_ws(text, pos)
    while text.startswith(opener, pos):
        key, pos = key_at(text, pos + len(opener))
        value_end = text.find(closer, pos)
        if value_end < 0:
            return None
        args[key] = unframe(text[pos:value_end])
        pos = skip_ws(text, value_end + len(closer))
    return args, pos


def tag_name(text: str, pos: int) -> tuple[str, int]:
    """The name in `<function=NAME>` (a tag name written after `=`), and where its tag ends."""
    end = text.find(">", pos)
    if end < 0:
        raise ValueError("a tag is cut")
    name = text[pos:end].strip()
    if not name or "\n" in name or "<" in name:
        raise ValueError("not a tag name")
    return name, end + 1


@dataclass(frozen=True, slots=True)
class XmlCall:
    """A call written as an XML element: `opener NAME head_end`, parameters `param_open KEY head_end value
    param_close`, then `closer` (Seed-OSS' and Qwen3-Coder's `<function=…>`, Step 3's and MiniMax-M2's
    `<invoke name="…">`). `name_at` reads a name or key and where its tag ends."""

    opener: str
    closer: str
    param_open: str
    param_close: str
    name_at: Callable[[str, int], tuple[str, int]]
    head_end: str = ">"

    def read(self, text: str, at: int, pos: int, calls: list[RawCall]) -> tuple[RawCall, int] | Markup | None:
        """The call at `pos` and where it ends; or how the markup at `at` (with `calls` read so far) ends
        there: open when the text stops inside the element, None when it isn't this format."""
        if not text.startswith(self.opener, pos):
            return open_markup(at, text, calls) if self.opener.startswith(text[pos:]) else None
        name, pos = self.name_at(text, pos + len(self.opener))
        params = xml_params(text, pos, self.param_open, self.param_close, self.name_at)
        if params is None:
            return open_markup(at, text, calls)
        args, pos = params
        if not text.startswith(self.closer, pos):
            return open_markup(at, text, calls) if self.closer.startswith(text[pos:]) else None
        return (name, args), pos + len(self.closer)

    def write(self, name: str, args: dict[str, Any], value: Callable[[Any], str], newline: str = "") -> str:
        """The element as a template writes it: `value` writes a parameter's value, `newline` ends each line."""
        params = "".join(
            f"{self.param_open}{k}{self.head_end}{value(v)}{self.param_close}{newline}" for k, v in args.items()
        )
        return f"{self.opener}{name}{self.head_end}{newline}{params}{self.closer}"


# How one call of a section is read: the call and where it ends, or how the markup ends there (`XmlCall.read`).
ReadCall = Callable[[str, int, int, list[RawCall]], "tuple[RawCall, int] | Markup | None"]


def call_section(text: str, at: int, opener: str, closer: str, call_opener: str, read: ReadCall) -> Markup | None:
    """`opener`, calls back to back (each starting with `call_opener`, read by `read`), then `closer`
    (MiniMax-M2's and M3's `<minimax:tool_call>` sections, Step 3's section tokens): open when the text
    stops inside, None when it isn't this format."""
    calls: list[RawCall] = []
    pos = skip_ws(text, at + len(opener))
    while text.startswith(call_opener, pos):
        read_call = read(text, at, pos, calls)
        if not isinstance(read_call, tuple):
            return read_call
        call, pos = read_call
        calls.append(call)
        pos = skip_ws(text, pos)
    if not calls:
        return None
    if text.startswith(closer, pos):
        return Markup(at, pos + len(closer), calls)
    return open_markup(at, text, calls) if closer.startswith(text[pos:]) else None


# Seed-OSS's and Qwen3-Coder's element: `<function=NAME>` holding `<parameter=KEY>value</parameter>`.
FUNCTION_XML = XmlCall("<function=", "</function>", "<parameter=", "</parameter>", tag_name)


def typed_xml_args(args: dict[str, str], props: dict[str, Any] | None) -> dict[str, Any]:
    """XML parameter text typed by the offered tool's schema: a string property keeps its text as
    written (code keeps its whitespace); anything else is read as JSON when it reads whole."""
    from tapfix.proxy.toolcalls.jsonfix import MISSING, loads_tolerant

    out: dict[str, Any] = {}
    for key, raw in args.items():
        schema = (props or {}).get(key)
        types = schema.get("type") if isinstance(schema, dict) else None
        types = [types] if isinstance(types, str) else list(types or [])
        if types == ["string"] or (not types and props is not None and key in props):
            out[key] = raw
            continue
        try:
            out[key] = json.loads(raw)
            continue
        except ValueError:
            pass
        parsed = loads_tolerant(raw)
        if parsed.value is not MISSING and not parsed.cut and not parsed.bad and not parsed.rest.strip():
            out[key] = parsed.value
        else:
            out[key] = raw
    return out


def json_blocks(text: str, at: int, opener: str, closer: str) -> Markup | None:
    """Calls written one JSON object per `opener…closer` block, back to back (InternLM's action blocks,
    LongCat's tags); a last block still open at the end of the text is kept as not closed."""
    calls = []
    pos = end = at
    while text.startswith(opener, pos):
        value, pos = json_value(text, pos + len(opener))
        calls.append(named_call(value))
        pos = skip_ws(text, pos)
        if not text.startswith(closer, pos):
            return Markup(at, len(text), calls, closed=False) if closer.startswith(text[pos:]) else None
        end = pos + len(closer)
        pos = skip_ws(text, end)
    return Markup(at, end, calls) if calls else None


def typed_calls(calls: list[RawCall], tools: list[dict[str, Any]]) -> list[tuple[str | None, Any]]:
    """Calls as a format read them, with XML-style values typed by the offered tool's schema and JSON
    text parsed: what a call's arguments are, for comparing a reading with what was meant."""
    from tapfix.proxy.toolcalls.schema import ToolSchemas

    schemas = ToolSchemas(tools)
    out: list[tuple[str | None, Any]] = []
    for name, args in calls:
        if isinstance(args, XmlArgs):
            args = typed_xml_args(args, schemas.properties(name))
        elif isinstance(args, str):
            args = json.loads(args)
        out.append((name, args))
    return out


def open_markup(at: int, text: str, calls: list[RawCall]) -> Markup | None:
    """Markup the text ends inside of: what it read so far, not closed (None when it read no call)."""
    return Markup(at, len(text), calls, closed=False) if calls else None


def unframe(value: str) -> str:
    """A value written on lines of its own (`>\nv\n</`): those two newlines are framing, not the value."""
    return value[1:-1] if len(value) >= 2 and value[0] == "\n" and value[-1] == "\n" else value


def frame(value: str) -> str:
    """What `unframe` reads back as `value`: one that starts and ends with a newline gets the framing."""
    return f"\n{value}\n" if unframe(value) != value else value
