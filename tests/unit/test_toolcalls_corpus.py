"""Every real broken stream of the corpus, split at random byte boundaries, judged as a strict client."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
from tapfix.proxy.toolcalls import ChatToolCallRepair

from tests.conftest import corpus_dir
from tests.support.builders import random_splits, sse
from tests.support.stage_io import client_view, run_stage

CORPUS = corpus_dir()
CASES = sorted(CORPUS.glob("*.json"))
assert len(CASES) >= 25, f"the corpus at {CORPUS} is incomplete"

TRANSIENT = re.compile(
    r"server[ _]error|unavailable|timeout|internal|overloaded|exhausted|terminated|try again|connection"
    r"|429|5\d\d",
    re.I,
)


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def parsed_calls(view) -> list[tuple[str, object]]:
    return [(c["name"], json.loads(c["arguments"])) for c in view.calls]


def expected_calls(case: dict) -> list[tuple[str, object]]:
    return [(c["name"], c["arguments"]) for c in case["expected"]]


def run(case: dict, seed: int, policy: str = "error") -> tuple[bytes, bytes, ChatToolCallRepair]:
    data = sse(case["stream"])
    stage = ChatToolCallRepair(case["tools"], policy=policy, capture_id="cap-7")
    out = run_stage(stage, random_splits(data, random.Random(seed)))
    return data, out, stage


def assert_error_event(view, policy: str = "error") -> None:
    assert len(view.errors) == 1 and view.done == 1 and view.after_done == 0
    assert not view.calls, "a held call is never emitted before the error"
    error = view.errors[0]
    assert error["tapfix"]["reason"] == "tool_call_unrecoverable"
    if policy == "error":
        assert error["type"] == "server_error" and error["code"] == 502
        assert error["message"].startswith("upstream server error: tapfix could not recover tool call")
        assert error["tapfix"]["capture_id"] == "cap-7"
    else:
        assert not TRANSIENT.search(json.dumps(error))


def test_corpus_is_there() -> None:
    assert len(CASES) >= 25


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_case(path: Path, seed: int) -> None:
    case = load(path)
    data, out, stage = run(case, seed)
    view = client_view(out)
    kind = case["scoring"]
    if kind == "passthrough":
        assert out == data
        assert stage.outcome == "untouched" and stage.changes == []
    elif kind == "repair":
        assert not view.errors
        assert parsed_calls(view) == expected_calls(case)
        assert [c.get("id") for c in view.calls] and all(c["id"] for c in view.calls)
        assert len({c["id"] for c in view.calls}) == len(view.calls)
        assert view.finish_reasons[-1:] == ["tool_calls"]
        assert view.done == 1 and view.after_done == 0
        assert stage.outcome in ("repaired", "recovered_from_error") and stage.changes
    elif kind == "detect":
        if view.errors:
            assert_error_event(view)
            assert stage.outcome == "unrecoverable"
        else:
            assert parsed_calls(view) == expected_calls(case)
    else:  # impossible: the rest passes sanely, and never a silently different call
        assert out == data or (view.errors and not view.calls) or parsed_calls(view) == expected_calls(case)


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_case_fail_fast_and_passthrough(path: Path) -> None:
    case = load(path)
    data, out, stage = run(case, 5, policy="fail_fast")
    view = client_view(out)
    if stage.outcome == "unrecoverable":
        assert_error_event(view, "fail_fast")
    data, out, stage = run(case, 6, policy="passthrough")
    if stage.outcome == "unrecoverable":
        note = [e for e in client_view(out).comments if e.startswith(b": tapfix: could not recover")]
        assert len(note) == 1
        assert out.replace(note[0], b"") == data


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_case_crlf_framing(path: Path) -> None:
    case = load(path)
    data = sse(case["stream"], newline="\r\n")
    stage = ChatToolCallRepair(case["tools"])
    out = run_stage(stage, random_splits(data, random.Random(3)))
    assert b"\n\n" not in out.replace(b"\r\n", b"")
    lf = run_stage(ChatToolCallRepair(case["tools"]), [sse(case["stream"])])
    assert out.replace(b"\r\n", b"\n") == lf


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_case_without_tools_only_passes_or_fixes_structured_calls(path: Path) -> None:
    """No `tools` in the request: leaked-call detection is off, so content is never touched."""
    case = load(path)
    data = sse(case["stream"])
    stage = ChatToolCallRepair(None)
    out = run_stage(stage, random_splits(data, random.Random(4)))
    view = client_view(out)
    original = client_view(data)
    if not view.errors:
        assert view.content == original.content or stage.outcome != "untouched"
