"""The table of truth: every defect class of a tool call, and what tapfix does with it per API surface.

One home for the claim, the behaviour and the test. The defect generator (`tapfix.proxy.mock.mutations`)
has one mutation per row, the property tests iterate over the rows and check the outcome the row
states, and the table in docs/repair.md is rendered from the rows (`python -m
tapfix.proxy.toolcalls.defects --readme docs/repair.md`; a test fails when the page differs). A row whose
outcome changes changes all three at once.

Outcomes:
- `repaired`: the client receives exactly the original calls (the change is recorded);
- `detected`: the turn ends with the retryable error and no call is handed out;
- `passed`: the stream goes out as sent (flagged where the row says so).

`preserves` says whether the mutation keeps the information the original calls carry. Only a
composition with a destroying mutation may end in the error, and never in a different call.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Final, Literal

from tapfix.proxy.surfaces import CHAT, MESSAGES, ApiSurface

Outcome = Literal["repaired", "detected", "passed"]
Surface = Literal["chat", "responses", "messages"]
SURFACES: Final[tuple[Surface, ...]] = ("chat", "responses", "messages")

# Defect kinds as tapfix records them (change rows' `kind`, the capture's `defects`).
WRONG_INDEX: Final = "wrong_index_or_id"
DUPLICATED: Final = "duplicated_fragments"
ARGS_AS_OBJECT: Final = "args_as_object"
INVALID_JSON: Final = "invalid_json"
SCHEMA_MISMATCH: Final = "schema_mismatch"
FINISH_MISMATCH: Final = "finish_reason_mismatch"
UNKNOWN_TOOL: Final = "unknown_tool"
WRONG_NAME: Final = "wrong_tool_name"
EMPTY_TURN: Final = "empty_tool_turn"
MISSING_FRAGMENT: Final = "missing_fragment"
MISSING_LAST_CHUNK: Final = "missing_last_chunk"
AMBIGUOUS_ESCAPE: Final = "ambiguous_escape"
LEAKED: Final = "leaked_into_content"
GLUED: Final = "glued_call"
FINISH_REPEATED: Final = "finish_repeated"


@dataclass(frozen=True, slots=True)
class DefectClass:
    id: str  # the mutation's name in the generator, and the row's key
    family: str  # the published table groups rows by it
    kind: str  # what tapfix records when it meets this class
    preserves: bool
    outcome: dict[Surface, Outcome]  # the surfaces where the class exists
    claim: str  # one line for the published table
    notes: tuple[str, ...] = field(default=())


def _all(outcome: Outcome) -> dict[Surface, Outcome]:
    return {s: outcome for s in SURFACES}


def _on(outcome: Outcome, *surfaces: ApiSurface) -> dict[Surface, Outcome]:
    """The class exists on these surfaces only, with this outcome."""
    return {s: outcome for s in SURFACES if any(s == api.name for api in surfaces)}


REPAIRED_ALL = _all("repaired")

DEFECTS: Final[tuple[DefectClass, ...]] = (
    # -- indexes and ids --------------------------------------------------------------------------------
    DefectClass(
        "index_offset",
        "indexes and ids",
        WRONG_INDEX,
        True,
        REPAIRED_ALL,
        "calls numbered from 1 (or any offset) instead of 0: renumbered densely from 0",
    ),
    DefectClass(
        "index_gap",
        "indexes and ids",
        WRONG_INDEX,
        True,
        REPAIRED_ALL,
        "a gap in the call indexes: renumbered densely in order of first appearance",
    ),
    DefectClass(
        "index_all_zero",
        "indexes and ids",
        WRONG_INDEX,
        True,
        _on("repaired", CHAT),
        "parallel calls all streamed on index 0: a delta with a new id and a name starts a new call",
    ),
    DefectClass(
        "id_churn",
        "indexes and ids",
        WRONG_INDEX,
        True,
        _on("repaired", CHAT),
        "a fresh id on every argument delta of one call: the call's first id wins",
    ),
    DefectClass(
        "id_missing", "indexes and ids", WRONG_INDEX, True, REPAIRED_ALL, "a call without an id: one is minted"
    ),
    DefectClass(
        "id_duplicate",
        "indexes and ids",
        WRONG_INDEX,
        True,
        REPAIRED_ALL,
        "two calls sharing an id: the later one gets a minted id",
    ),
    DefectClass(
        "two_calls_one_delta",
        "indexes and ids",
        WRONG_INDEX,
        True,
        _on("repaired", CHAT),
        "two calls opened in one delta: kept apart (as sent, when already well formed)",
    ),
    DefectClass(
        "glued_call",
        "indexes and ids",
        GLUED,
        True,
        REPAIRED_ALL,
        'a call glued into the arguments of the one before it, its offered name (bare, or a `{"name": …}`'
        " object) right after that call's object: split into two calls; no name there, no split",
    ),
    # -- names ------------------------------------------------------------------------------------------
    DefectClass(
        "name_repeated",
        "names",
        DUPLICATED,
        True,
        REPAIRED_ALL,
        "a name sent again on a later delta (`get_weatherget_weather`): the offered name",
    ),
    DefectClass(
        "name_split",
        "names",
        WRONG_NAME,
        True,
        _on("repaired", CHAT),
        "a name streamed in pieces: joined (as sent, when already well formed)",
    ),
    DefectClass(
        "name_case",
        "names",
        WRONG_NAME,
        True,
        REPAIRED_ALL,
        "a name in another case or separator style of exactly one offered tool: the offered name",
    ),
    DefectClass(
        "unknown_tool",
        "names",
        UNKNOWN_TOOL,
        True,
        _all("passed"),
        "a name that matches no offered tool: passed through as sent, flagged `invalid_tool_call`",
    ),
    # -- duplicated fragments ---------------------------------------------------------------------------
    DefectClass(
        "resent_at_finish",
        "duplicated fragments",
        DUPLICATED,
        True,
        REPAIRED_ALL,
        "the whole arguments resent at the finish (vLLM's final flush): sent once",
    ),
    DefectClass(
        "fragment_duplicated",
        "duplicated fragments",
        DUPLICATED,
        True,
        REPAIRED_ALL,
        "one fragment sent twice in a row (MTP / speculative decoding), when the copy breaks the JSON",
    ),
    DefectClass(
        "objects_concatenated",
        "duplicated fragments",
        DUPLICATED,
        True,
        REPAIRED_ALL,
        "the same arguments object twice, back to back: sent once",
    ),
    DefectClass(
        "args_as_object",
        "duplicated fragments",
        ARGS_AS_OBJECT,
        True,
        _on("repaired", CHAT),
        "arguments sent as a JSON object instead of a string (Ollama, MiniMax): serialized",
    ),
    # -- escapes and JSON -------------------------------------------------------------------------------
    DefectClass(
        "path_backslashes",
        "escapes",
        INVALID_JSON,
        True,
        REPAIRED_ALL,
        "Windows and UNC paths written with single backslashes, `\\t` `\\n` `\\b` inside them"
        " included: read as literal backslashes",
    ),
    DefectClass(
        "escaped_whitespace",
        "escapes",
        INVALID_JSON,
        True,
        REPAIRED_ALL,
        "literal `\\n` / `\\t` between JSON tokens, outside any string: dropped",
    ),
    DefectClass(
        "raw_control_characters",
        "escapes",
        INVALID_JSON,
        True,
        REPAIRED_ALL,
        "raw newlines, tabs and other control characters inside strings: escaped",
    ),
    DefectClass(
        "unescaped_quotes",
        "escapes",
        INVALID_JSON,
        True,
        REPAIRED_ALL,
        "unescaped quotes inside a value whose end the structure makes unambiguous: escaped",
    ),
    # -- schema -----------------------------------------------------------------------------------------
    DefectClass(
        "scalar_as_string",
        "schema",
        SCHEMA_MISMATCH,
        True,
        REPAIRED_ALL,
        "numbers and booleans sent as strings where the schema wants them typed: converted",
    ),
    DefectClass(
        "container_as_string",
        "schema",
        SCHEMA_MISMATCH,
        True,
        REPAIRED_ALL,
        "arrays and objects sent as JSON strings where the schema wants them: parsed",
    ),
    # -- finish reason ----------------------------------------------------------------------------------
    DefectClass(
        "finish_stop_with_calls",
        "finish reason",
        FINISH_MISMATCH,
        True,
        _on("repaired", CHAT, MESSAGES),
        "`stop` (Messages: `end_turn`) with calls: corrected to `tool_calls` (`tool_use`); a named"
        " `tool_choice` keeps `stop`, as OpenAI and vLLM send it",
    ),
    DefectClass(
        "finish_length_complete",
        "finish reason",
        FINISH_MISMATCH,
        True,
        _on("repaired", CHAT, MESSAGES),
        "`length` (`max_tokens`) with calls that are complete and fit the schema, and nothing after them:"
        " kept, finish corrected",
    ),
    DefectClass(
        "finish_repeated",
        "finish reason",
        FINISH_REPEATED,
        True,
        _on("repaired", CHAT),
        "a second finish after the first (a trailing `stop` after `tool_calls`): dropped, one finish per choice",
    ),
    # -- information lost -------------------------------------------------------------------------------
    DefectClass(
        "fragment_dropped",
        "information lost",
        MISSING_FRAGMENT,
        False,
        _all("detected"),
        "a fragment lost across a value's end: the call is never handed out",
    ),
    DefectClass(
        "arguments_cut",
        "information lost",
        MISSING_LAST_CHUNK,
        False,
        _all("detected"),
        "arguments cut short (by `max_tokens`, a lost last chunk, an upstream error)",
    ),
    DefectClass(
        "required_missing",
        "information lost",
        MISSING_FRAGMENT,
        False,
        _all("detected"),
        "a required argument never sent",
    ),
    DefectClass(
        "length_after_calls",
        "information lost",
        MISSING_LAST_CHUNK,
        False,
        _all("detected"),
        "`length` (`max_tokens`) with complete calls and a sign that more was coming: a further call"
        " opened, text after the last call, a calls section left open",
    ),
    DefectClass(
        "empty_tool_turn",
        "information lost",
        EMPTY_TURN,
        False,
        _on("detected", CHAT, MESSAGES),
        "a `tool_calls` (`tool_use`) finish with no call at all: never a silent empty turn",
    ),
    # -- leaked markup (issue 17: the registry of formats, proxy/toolcalls/formats/) ----------------------
    DefectClass(
        "leaked_markup",
        "leaked markup",
        LEAKED,
        True,
        REPAIRED_ALL,
        "a call written as the model's own markup where a call stands in the text (any registered format,"
        " table below; an example in a sentence, quotes, a list, a table or code stays text: docs/formats.md),"
        " or last in the reasoning: turned back into a call",
    ),
    DefectClass(
        "leaked_markup_cut",
        "leaked markup",
        MISSING_LAST_CHUNK,
        False,
        _all("detected"),
        "a call written as markup, cut by `max_tokens` past its opener: never left as half-written text",
    ),
)

BY_ID: Final[dict[str, DefectClass]] = {d.id: d for d in DEFECTS}

_WORDS: Final[dict[Outcome, str]] = {"repaired": "repaired", "detected": "retryable error", "passed": "as sent"}
README_BEGIN: Final = "<!-- defect-table: generated by python -m tapfix.proxy.toolcalls.defects --readme -->"
README_END: Final = "<!-- /defect-table -->"


def render_markdown() -> str:
    """The published table: one row per defect class, one column per surface."""
    lines = [
        "| defect | chat | responses | messages |",
        "| --- | --- | --- | --- |",
    ]
    family = ""
    for d in DEFECTS:
        if d.family != family:
            family = d.family
            lines.append(f"| **{family}** | | | |")
        cells = [_WORDS[d.outcome[s]] if s in d.outcome else "—" for s in SURFACES]
        lines.append(f"| {d.claim} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_formats() -> str:
    """The registry of tool-call formats as the table of truth states it: where a leaked call in each
    format is recovered from, on every surface (tests/unit/test_toolformats_evented.py, test_toolformats_stage.py
    and the leak property tests/unit/test_toolcalls_leak_defects.py check each claim)."""
    from tapfix.proxy.toolcalls.formats import REGISTRY

    lines = [
        "| format | family | from content | from reasoning (last in the turn) |",
        "| --- | --- | --- | --- |",
    ]
    for name in sorted(REGISTRY):
        fmt = REGISTRY[name]
        where = "chat, responses, messages"
        # A marker-less format reads only at the start of the content; in the reasoning it would follow
        # the model's thoughts, where nothing marks it (and the leak property doesn't put it there).
        reasoning = "—" if fmt.anchored else where
        aliases = f" (also `{'`, `'.join(fmt.aliases)}`)" if fmt.aliases else ""
        lines.append(f"| `{name}`{aliases} | {fmt.family} | {where} | {reasoning} |")
    return "\n".join(lines)


def readme_block() -> str:
    formats = f"Tool-call formats recovered from text:\n\n{render_formats()}"
    return f"{README_BEGIN}\n{render_markdown()}\n\n{formats}\n{README_END}"


def replace_block(text: str) -> str:
    """`text` with its generated block replaced by the current one (ValueError: the markers are missing)."""
    start = text.index(README_BEGIN)
    end = text.index(README_END, start) + len(README_END)
    return text[:start] + readme_block() + text[end:]


def main(argv: list[str]) -> int:
    if argv[1:2] == ["--readme"]:
        path = argv[2] if len(argv) > 2 else "docs/repair.md"
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new = replace_block(text)
        if new != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
        return 0
    print(render_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
