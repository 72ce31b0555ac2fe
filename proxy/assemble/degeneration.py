"""Degeneration detectors: does an answer drift into another script, loop, or call a tool wrongly?

They run in the store's writer thread for every captured response, so each is one pass over a
bounded window, mostly in C (regex, zlib, orjson), and none raises: odd input yields "no flag",
never an exception that would cost the capture. The thresholds are deliberately conservative:
a flag is a hint to look at a capture, and a noisy flag is one nobody filters on.
"""

from __future__ import annotations

import functools
import re
import zlib
from collections import Counter
from typing import Any

import orjson
from tapfix.proxy.jsonbody import json_object

# Han (+ extension A, compatibility, extension B..), kana, hangul, CJK and full-width punctuation.
_CJK_CLASS = (
    "\u3000-\u303f\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
    "\uf900-\ufaff\uff00-\uffef\U00020000-\U0002fa1f"
)
# A run of CJK characters; whitespace inside does not break it (Korean uses spaces).
_CJK_RUN = re.compile(f"[{_CJK_CLASS}][{_CJK_CLASS}\\s]*")
_CJK_CHAR = re.compile(f"[{_CJK_CLASS}]")
_LATIN = re.compile(r"[A-Za-z\u00c0-\u024f]")
_SPACE = re.compile(r"\s+")

DRIFT_RUN = 32  # CJK characters in one run
DRIFT_TOTAL = 64  # or this many CJK characters in all ...
DRIFT_SHARE = 0.25  # ... making up this share of the letters after the Latin start
LATIN_LEAD = 16  # Latin letters before the first CJK character: "the answer started in Latin script"
SCAN_CHARS = 200_000  # beyond this, only the head and the tail are looked at

LOOP_WINDOW_TOKENS = 2000
LOOP_NGRAM = 10
LOOP_MIN_REPEATS = 4  # an n-gram seen this often counts as repeated ...
LOOP_COVERAGE = 0.8  # ... and repeated n-grams cover this share of the window
LOOP_MIN_TOKENS = 60
LOOP_ZLIB_RATIO = 3.5  # prose compresses ~2-3x, loops 5x and more: below this, skip the exact count
LINE_MIN_CHARS = 16
LINE_MIN_REPEATS = 6
LINE_SHARE = 0.3
_TOKEN = re.compile(r"[A-Za-z0-9_]+|\S")


def _bounded(text: str) -> str:
    if len(text) <= SCAN_CHARS:
        return text
    half = SCAN_CHARS // 2
    return text[:half] + "\n" + text[-half:]


def has_cjk(text: str) -> bool:
    return _CJK_CHAR.search(text) is not None


def latin_dominant(text: str) -> bool | None:
    """True for Latin-script text, False for CJK text, None when there is too little to tell."""
    text = _bounded(text)
    latin = len(_LATIN.findall(text))
    cjk = len(_CJK_CHAR.findall(text))
    if latin + cjk < LATIN_LEAD:
        return None
    if cjk * 50 <= latin:  # under 2% CJK: an English (or other Latin-script) conversation
        return True
    if cjk >= latin:
        return False
    return None


def script_drift(text: str, *, conversation_latin: bool | None = None) -> bool:
    """An answer in Latin script that turns into a long CJK run (wrong template, broken quant).

    Without the request, only an answer that *starts* in Latin script can drift. When the caller
    knows the conversation is in Latin script (`conversation_latin=True`), any long CJK run counts;
    when it knows the conversation is CJK (`False`), nothing does.
    """
    if conversation_latin is False or not text:
        return False
    text = _bounded(text)
    first = _CJK_CHAR.search(text)
    if first is None:
        return False
    if conversation_latin is not True and len(_LATIN.findall(text, 0, first.start())) < LATIN_LEAD:
        return False
    total = 0
    for match in _CJK_RUN.finditer(text, first.start()):
        run = len(match.group()) - sum(len(s) for s in _SPACE.findall(match.group()))
        if run >= DRIFT_RUN:
            return True
        total += run
    if total < DRIFT_TOTAL:
        return False
    latin_after = len(_LATIN.findall(text, first.start()))
    return total >= DRIFT_SHARE * (total + latin_after)


def repetition_loop(text: str) -> bool:
    """The tail of the answer repeats itself: the same lines or the same n-grams, over and over."""
    if not text:
        return False
    text = _bounded(text)
    return _repeated_lines(text) or _repeated_ngrams(text[-40_000:])


def _repeated_lines(text: str) -> bool:
    lines = [line for line in (raw.strip() for raw in text.splitlines()) if line]
    if len(lines) < LINE_MIN_REPEATS:
        return False
    counts = Counter(line for line in lines if len(line) >= LINE_MIN_CHARS)
    if not counts:
        return False
    line, count = counts.most_common(1)[0]
    return count >= LINE_MIN_REPEATS and count * len(line) >= LINE_SHARE * sum(len(x) for x in lines)


def _repeated_ngrams(tail: str) -> bool:
    raw = tail.encode("utf-8", "surrogatepass")
    if len(raw) < 256 or len(raw) / max(1, len(zlib.compress(raw[-16384:], 1))) < LOOP_ZLIB_RATIO:
        return False
    tokens = _TOKEN.findall(tail)[-LOOP_WINDOW_TOKENS:]
    if len(tokens) < LOOP_MIN_TOKENS:
        return False
    n = LOOP_NGRAM
    grams = [hash(tuple(tokens[i : i + n])) for i in range(len(tokens) - n + 1)]
    counts = Counter(grams)
    repeated = sum(1 for g in grams if counts[g] >= LOOP_MIN_REPEATS)
    return repeated >= LOOP_COVERAGE * len(grams)


# --- tool calls -------------------------------------------------------------------------------


def tool_schemas(tools: Any) -> dict[str, Any]:
    """name -> parameters schema, from OpenAI chat, Responses-API or Anthropic style tool lists."""
    out: dict[str, Any] = {}
    if not isinstance(tools, list):
        return out
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        spec: dict[str, Any] = function if isinstance(function, dict) else tool
        name = spec.get("name")
        if isinstance(name, str):
            out[name] = spec.get("parameters", spec.get("input_schema"))
    return out


def tool_call_problems(calls: Any, tools: Any = None) -> list[str]:
    """One message per invalid call: unknown tool, arguments that don't parse, or fail the schema.

    Without `tools`, only the arguments' syntax is checked (they must be a JSON object).
    """
    problems: list[str] = []
    if not isinstance(calls, list):
        return problems
    schemas = tool_schemas(tools) if tools else None
    for i, call in enumerate(calls):
        if not isinstance(call, dict):
            continue
        name = call.get("name") or ""
        label = f"call {i} {name or '(no name)'}"
        arguments = call.get("arguments")
        if isinstance(arguments, str):
            try:
                value = orjson.loads(arguments) if arguments.strip() else {}
            except orjson.JSONDecodeError as e:
                problems.append(f"{label}: arguments are not JSON ({e})")
                continue
        else:
            value = arguments if arguments is not None else {}
        if not isinstance(value, dict):
            problems.append(f"{label}: arguments are not a JSON object")
            continue
        if schemas is None:
            continue
        if name not in schemas:
            problems.append(f"{label}: no such tool in the request")
            continue
        message = _schema_error(schemas[name], value)
        if message:
            problems.append(f"{label}: {message}")
    return problems


def _schema_error(schema: Any, value: dict[str, Any]) -> str | None:
    if not isinstance(schema, dict) or not schema:
        return None
    try:
        validator = _validator(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
        if validator is None:
            return None
        error = next(iter(validator.iter_errors(value)), None)
    except Exception:  # noqa: BLE001 - an exotic schema can't cost a capture: no verdict
        return None
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where + ': ' if where else ''}{error.message}"[:300]


@functools.lru_cache(maxsize=128)
def _validator(schema_json: bytes) -> Any:
    """Agents resend the same tools every turn: build each schema's validator once."""
    from jsonschema import validators
    from jsonschema.exceptions import SchemaError

    schema = orjson.loads(schema_json)
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except SchemaError:
        return None
    return cls(schema)


def request_language(body: bytes | None) -> bool | None:
    """Is the conversation in Latin script? From the user turns of a chat request (None: can't tell)."""
    if not body or len(body) > 16 * 1024 * 1024:
        return None
    obj = json_object(body)
    if obj is None:
        return None
    messages = obj.get("messages") if isinstance(obj.get("messages"), list) else obj.get("input")
    if isinstance(messages, str):
        return latin_dominant(messages)
    if not isinstance(messages, list):
        return None
    texts: list[str] = []
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            texts.append(_text_of(message.get("content")))
    return latin_dominant("\n".join(texts)) if texts else None


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part.get("text", "") for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""
