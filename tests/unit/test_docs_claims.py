"""Claims the docs make that the code can contradict, each checked against the code that decides it.

The QA pass found the README naming a flag tapfix never sets (`unknown_tool`; a call to a tool that wasn't
offered is flagged `invalid_tool_call`) and docs/regenerate.md listing `regenerate_unknown_tool` as not
built on the Responses and Messages surfaces, where it is.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import get_args

from tapfix.proxy.assemble import assemble
from tapfix.proxy.assemble.flags import response_flags
from tapfix.proxy.changes import Stage
from tapfix.proxy.toolcalls.evented_stage import HoldingStage

from tests.support.builders import tool

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_the_flag_the_docs_name_for_a_call_to_a_tool_not_offered_is_the_one_set() -> None:
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "nope", "arguments": "{}"}}],
    }
    body = {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}
    assembled = assemble(json.dumps(body).encode(), "application/json", "/v1/chat/completions")
    tools = [tool("write", {"path": {"type": "string"}}, ["path"])]
    flags = response_flags(assembled, 200, False, tools=tools)
    assert "invalid_tool_call" in flags
    table = (ROOT / "docs" / "repair.md").read_text()  # the defect table
    (row,) = [line for line in table.splitlines() if "a name that matches no offered tool" in line]
    named = re.findall(r"flagged `([a-z_]+)`", row)
    assert named and set(named) <= flags, (named, flags)
    for doc in DOCS:
        assert "flagged `unknown_tool`" not in doc.read_text(), doc


def test_regenerate_md_lists_as_not_built_only_what_is_not() -> None:
    text = (ROOT / "docs" / "regenerate.md").read_text()
    not_built = [line for line in text.splitlines() if "not built" in line.lower()]
    assert hasattr(HoldingStage, "__init__") and "defer_unknown_tool" in HoldingStage.__init__.__code__.co_names
    for line in not_built:  # the evented stages hold a call to an unknown tool: it is built there
        assert "regenerate_unknown_tool" not in line, line


def test_the_stages_table_names_each_stage_a_change_can_have_once() -> None:
    """docs/changes.md's table of stages is the `Stage` type's values: none missing, none made up."""
    text = (ROOT / "docs" / "changes.md").read_text()
    marker = "<!-- stages: "
    table = text[text.index(marker) :].split("\n\n", 1)[0]
    named = re.findall(r"^\| `([a-z_]+)` \|", table, flags=re.M)
    assert sorted(named) == sorted(get_args(Stage)), named
    assert len(named) == len(set(named))
