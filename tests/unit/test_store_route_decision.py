"""Issue 38: the route decision an exchange carries is stored (migration m008), shown by `captures show` (text and
`--json`, against schemas/capture.schema.json), filtered by `captures list --route`, and drawn on the exchange page."""

from __future__ import annotations

import json
import sqlite3
from importlib.resources import files
from pathlib import Path

import jsonschema
from click.testing import CliRunner
from starlette.testclient import TestClient
from tapfix.proxy.browse import create_app
from tapfix.proxy.cli import main

from tests.unit.test_store_attempts import exchange, write

DECISION = {
    "model": "coder",
    "route": "long-context",
    "upstream": "cloud",
    "served_model": "deepseek-v4-flash",
    "matched": "prompt_tokens_over 100,000",
    "inputs": {
        "prompt_tokens": 140210,
        "prompt_source": "estimate",
        "max_tokens": None,
        "needs": ["tools"],
        "headers": {},
        "user_agent": "opencode/1",
        "thread": None,
    },
    "rejected": [{"route": "fast", "upstream": "gpu0", "kind": "failed", "reason": "upstream gpu0 failed: refused"}],
    "not_matched": [],
    "attempts": [],
}


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def test_the_decision_is_stored_shown_filtered_and_drawn(tmp_path: Path) -> None:
    routed, plain = exchange(), exchange()
    routed.extra["route_decision"] = DECISION
    routed.route = "long-context"
    path = tmp_path / "c.db"
    write(path, [routed, plain])
    text = cli("captures", "show", routed.id, "--db", str(path))
    assert "  route: long-context → cloud/deepseek-v4-flash   matched: prompt_tokens_over 100,000" in text
    assert "    rejected fast (gpu0): upstream gpu0 failed: refused" in text
    assert "route:" not in cli("captures", "show", plain.id, "--db", str(path))
    schema = json.loads((files("tapfix.schemas") / "capture.schema.json").read_text(encoding="utf-8"))
    for ex, expected in ((routed, DECISION), (plain, None)):
        shown = json.loads(cli("captures", "show", ex.id, "--db", str(path), "--json"))
        jsonschema.validate(shown, schema)
        assert shown["route_decision"] == expected
    listed = cli("captures", "list", "--db", str(path), "--route", "long-context", "--json")
    assert [json.loads(line)["id"] for line in listed.splitlines()] == [routed.id]
    assert cli("captures", "list", "--db", str(path), "--route", "nope").strip() == "no capture matches --route nope"
    with TestClient(create_app(path, background_index=False), base_url="http://127.0.0.1") as client:
        page = client.get(f"/exchange/{routed.id}").text
        assert "<dt>route</dt><dd>long-context → cloud/deepseek-v4-flash" in page
        assert "rejected fast (gpu0): upstream gpu0 failed: refused" in page
        assert "<dt>route</dt>" not in client.get(f"/exchange/{plain.id}").text


def test_a_slot_is_stored_with_the_answers_cache_n_shown_and_drawn(tmp_path: Path) -> None:
    """A llama.cpp slot pin (request/slots.py) of a model without routes: a decision of its slot alone, the
    answer's `timings.cache_n` in it, and in `cached_tokens` where the usage says nothing of the cache."""
    pinned = exchange()
    pinned.extra["slot"] = {"upstream": "llama", "slot": 1, "thread": "t1", "role": "main", "how": "kept"}
    answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}
    answer |= {"usage": {"prompt_tokens": 50, "completion_tokens": 1}, "timings": {"cache_n": 42, "prompt_n": 8}}
    pinned.response = json.dumps(answer).encode()
    pinned.content_type = "application/json"
    path = tmp_path / "c.db"
    write(path, [pinned])
    shown = json.loads(cli("captures", "show", pinned.id, "--db", str(path), "--json"))
    assert shown["route_decision"] == {"slot": {**pinned.extra["slot"], "cache_n": 42}}
    assert shown["cached_prompt_tokens"] == 42
    with sqlite3.connect(path) as db:
        assert db.execute("select cached_tokens from exchanges").fetchone() == (42,)  # what `captures stats` sums
    text = cli("captures", "show", pinned.id, "--db", str(path))
    assert "  slot: 1 on llama (kept), thread t1 (main); cache_n 42 prompt tokens from the slot's cache" in text
    assert "route:" not in text
    with TestClient(create_app(path, background_index=False), base_url="http://127.0.0.1") as client:
        page = client.get(f"/exchange/{pinned.id}").text
        assert "<dt>llama.cpp slot</dt><dd>1 on llama" in page and "42 prompt tokens from its cache" in page
        assert "<dt>route</dt>" not in page
