"""`captures show ID --json`: one object, valid against schemas/capture.schema.json, bodies byte-exact."""

from __future__ import annotations

import base64
import json
from importlib.resources import files
from typing import Any

import pytest
from click.testing import CliRunner
from jsonschema import Draft202012Validator
from tapfix.proxy.cli import main

from tests.support.capture_store import Store

BODIES = ("request", "forwarded", "response", "client_response")
EXPORT_FLAG = {
    "request": "--original",
    "forwarded": "--forwarded",
    "response": "--response",
    "client_response": "--client-response",
}


def _validator() -> Draft202012Validator:
    schema = json.loads((files("tapfix.schemas") / "capture.schema.json").read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _show(store: Store, capture_id: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["captures", "show", capture_id, "--db", str(store.path), "--json"])
    assert result.exit_code == 0, result.output
    shown: dict[str, Any] = json.loads(result.stdout)
    return shown


def _bytes(body: dict[str, str]) -> bytes:
    return body["text"].encode() if body["encoding"] == "utf-8" else base64.b64decode(body["data"])


@pytest.mark.parametrize("which", ["streamed", "binary", "private", "failed"])
def test_show_json_validates_against_the_schema(store: Store, which: str) -> None:
    shown = _show(store, getattr(store, which))
    errors = [e.message for e in _validator().iter_errors(shown)]
    assert not errors, errors
    assert shown["id"] == getattr(store, which) and set(shown["bodies"]) == set(BODIES)


def test_bodies_are_the_bytes_export_writes(store: Store) -> None:
    for capture_id in (store.streamed, store.binary):
        shown = _show(store, capture_id)
        for which in BODIES:
            exported = CliRunner().invoke(
                main, ["captures", "export", capture_id, "--db", str(store.path), EXPORT_FLAG[which]]
            )
            assert exported.exit_code == 0, exported.output
            assert _bytes(shown["bodies"][which]) == exported.stdout_bytes, (capture_id, which)


def test_everything_show_prints_is_in_the_object(store: Store) -> None:
    shown = _show(store, store.streamed)
    assert shown["model"] == "m" and shown["status"] == 200 and shown["stream"] is True
    assert shown["flags"] == ["runaway_length"] and shown["tags"] == ["probe"]
    assert shown["timings"]["first_token_ms"] is not None and shown["timings"]["chunk_count"] == 2
    assert shown["changes"] == [
        {
            "stage": "request",
            "kind": "inject",
            "path": "$.temperature",
            "before": None,
            "after": 0.6,
            "reason": "generation_config default",
        }
    ]
    assert shown["assembled"]["content"] == "HELLO"
    assert json.loads(shown["bodies"]["forwarded"]["text"])["temperature"] == 0.6
    assert shown["bodies"]["request"]["text"].endswith('"hi é"}]}')


def test_encodings_and_absent_bodies(store: Store) -> None:
    binary = _show(store, store.binary)
    assert binary["bodies"]["response"]["encoding"] == "base64"
    assert _bytes(binary["bodies"]["response"]) == bytes(range(256))
    assert binary["bodies"]["request"] == {"encoding": "utf-8", "text": "{}"}
    assert _show(store, store.private)["bodies"] == dict.fromkeys(BODIES)
    failed = _show(store, store.failed)["bodies"]
    assert failed["request"] is not None and failed["response"] is None and failed["client_response"] is None


def test_the_schema_rejects_a_wrong_shape(store: Store) -> None:
    """The validation above can fail: a renamed or mistyped key is caught."""
    shown = _show(store, store.streamed)
    for broken in (
        {**shown, "bodies": {**shown["bodies"], "request": {"encoding": "utf-8"}}},
        {**shown, "bodies": {**shown["bodies"], "response": {"encoding": "latin-1", "text": "x"}}},
        {k: v for k, v in shown.items() if k != "timings"},
        {**shown, "flags": "runaway_length"},
    ):
        assert list(_validator().iter_errors(broken))
    assert not list(_validator().iter_errors({**shown, "added_later": 1})), "later keys are allowed"


def test_show_without_json_still_reads(store: Store) -> None:
    result = CliRunner().invoke(main, ["captures", "show", store.streamed, "--db", str(store.path)])
    assert (
        result.exit_code == 0
        and f"capture {store.streamed}" in result.stdout
        and "inject $.temperature" in result.stdout
    )
    missing = CliRunner().invoke(main, ["captures", "show", "zzzz", "--db", str(store.path), "--json"])
    assert missing.exit_code == 1 and "no capture with id" in missing.stderr and not missing.stdout
