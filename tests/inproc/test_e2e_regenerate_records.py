"""Issue 31, item 8: what a regenerated request's capture, spans and metrics say is what the client got.

`tapfix run --regenerate 1 --otlp RECEIVER` in front of `tapfix mock`: attempt 1 cuts its call, attempt 2
fails at the HTTP level (a 500) or answers an HTML page as an event stream. The client gets the retryable
`tool_call_unrecoverable` error on every surface, so its capture is flagged `toolcall_unrecoverable` and its
span is an error; each attempt is recorded, exported and counted as an attempt of the upstream it went to
(`tapfix.upstream`, `tapfix_regenerations_total{upstream=...}` with outcome `error`), never as one more
client request (`tapfix_requests_total`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from tapfix.proxy.telemetry import semconv as sc

from tests.inproc.test_e2e_regenerate import rows
from tests.support.ci import unavailable
from tests.support.inproc import InprocProxy, start_mock, start_proxy
from tests.support.procs import until
from tests.support.sdk_turn import SURFACES, Turn, ask

BROKEN = {"do": "break_tool_call", "mode": "truncate"}
SCENARIO = {
    "rules": [
        {"when": {"model": "500-later", "attempt": 1}, **BROKEN},
        {"when": {"model": "500-later"}, "do": "http_error", "status": 500},
        {"when": {"model": "html-later", "attempt": 1}, **BROKEN},
        {"when": {"model": "html-later"}, "do": "garbage"},
    ]
}
ASKED = [(surface, "500-later") for surface in SURFACES] + [("chat", "html-later")]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InprocProxy, Any, list[Turn]]]:
    """The proxy, its OTLP receiver, and the turns asked through it (streamed, the real SDKs)."""
    try:
        import opentelemetry.sdk.trace  # noqa: F401 - tapfix[otel], what `--otlp` needs

        from tests.support.otlp_receiver import OtlpReceiver
    except ImportError as e:
        unavailable(f"OTLP export needs tapfix[otel] and opentelemetry-proto ({e.name})")
    tmp: Path = tmp_path_factory.mktemp("regenerate-records")
    (tmp / "scenario.json").write_text(json.dumps(SCENARIO))
    receiver = OtlpReceiver()
    mock = start_mock(tmp, "--scenario", str(tmp / "scenario.json"))
    proxy = start_proxy(tmp, mock.url, "--regenerate", "1", "--otlp", receiver.url)
    try:
        turns = [ask(proxy.url, surface, model, stream=True) for surface, model in ASKED]
        yield proxy, receiver, turns
    finally:
        proxy.stop()
        mock.stop()
        receiver.close()


_until = partial(until, timeout=20.0, every=0.2)


def test_the_client_gets_the_retryable_error_and_the_capture_says_so(
    exported: tuple[InprocProxy, Any, list[Turn]],
) -> None:
    proxy, _, turns = exported
    for turn in turns:
        assert turn.error is not None and "server error" in turn.error_text, turn
        parent, attempt = rows(proxy.extra["db"], str(turn.capture_id), 2)
        assert {"regenerated", "toolcall_unrecoverable"} <= set(json.loads(parent["flags"])), parent["flags"]
        assert attempt["attempt_of"] == parent["id"] and "upstream_error" in json.loads(attempt["flags"])


def test_spans_say_what_the_client_got_and_where_each_attempt_went(
    exported: tuple[InprocProxy, Any, list[Turn]],
) -> None:
    _, receiver, turns = exported
    ids = {str(t.capture_id) for t in turns}

    def spans() -> list[Any]:
        got = [s for s in receiver.spans() if s.attributes.get(sc.TAPFIX_ATTEMPT_OF) in ids]
        return got if len(got) == len(turns) else []

    attempts = _until(spans)
    assert attempts, "every attempt's span was exported"
    parents = {
        s.attributes[sc.TAPFIX_CAPTURE_ID]: s for s in receiver.spans() if s.attributes.get(sc.TAPFIX_CAPTURE_ID) in ids
    }
    assert set(parents) == ids
    for span in parents.values():
        assert span.status_code == 2 and span.attributes[sc.ERROR_TYPE] == sc.ERROR_UNRECOVERABLE, span
    for span in attempts:
        assert span.attributes[sc.TAPFIX_UPSTREAM] == "default" and span.attributes[sc.TAPFIX_ATTEMPT] == 2
        assert span.status_code == 2, "the attempt the client couldn't use is an error"


def _samples(proxy: InprocProxy, name: str) -> list[tuple[dict[str, str], float]]:
    text = httpx.get(proxy.url + "/tapfix/metrics", timeout=10).text
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) + 1 :].rsplit("} ", 1)
            pairs = (part.split("=", 1) for part in labels.split('",') if part)
            out.append(({k: v.strip('"') for k, v in pairs}, float(value)))
    return out


def test_metrics_count_attempts_apart_from_client_requests(exported: tuple[InprocProxy, Any, list[Turn]]) -> None:
    proxy, _, turns = exported
    requests = _until(
        lambda: (got := _samples(proxy, "tapfix_requests_total")) and sum(v for _, v in got) >= len(turns) and got
    )
    assert sum(v for _, v in requests) == len(turns), "one per client request, none per attempt"
    assert {labels["upstream"] for labels, _ in requests} == {"default"}
    attempts = _until(lambda: _samples(proxy, "tapfix_regenerations_total"))
    assert sum(v for _, v in attempts) == len(turns)
    assert {(labels["upstream"], labels["outcome"]) for labels, _ in attempts} == {("default", "error")}
    unrecoverable = _samples(proxy, "tapfix_unrecoverable_calls_total")
    assert sum(v for _, v in unrecoverable) == len(turns), "what reached each client: an unrecoverable call"
