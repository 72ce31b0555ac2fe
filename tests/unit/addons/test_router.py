"""Router in-process: where a flow goes, what the policy rewrote (with framing kept true), and what it
answers itself; guard clauses for flows it must not touch. The upstream is never dialled."""

from __future__ import annotations

import orjson
import pytest
from mitmproxy import http
from tapfix.addons.router import Router
from tapfix.addons.runner.runtime import Runtime

from tests.support.flows import flow, json_response, reachable, recorded, requested, runtime

CONFIG = {
    "upstreams": {
        "gpu0": {"base_url": "http://127.0.0.1:9/v1", "engine": "vllm"},
        "gpu1": {"base_url": "http://127.0.0.1:10/v1", "engine": "vllm"},
    },
    "models": {"qwen": {"upstream": "gpu0", "upstream_model": "Qwen/Qwen3-32B"}, "glm": {"upstream": "gpu1"}},
}


def route(rt: Runtime, f: http.HTTPFlow) -> None:
    requested(Router(rt), f)


def test_quick_mode_points_the_flow_at_the_upstream_and_asks_for_identity() -> None:
    rt = reachable(runtime())
    f = flow(body={"model": "m", "messages": []}, headers={"accept-encoding": "gzip, br"})
    ex = recorded(f)
    route(rt, f)
    assert f.response is None
    assert (f.request.scheme, f.request.host, f.request.port, f.request.path) == (
        "http",
        "127.0.0.1",
        9,
        "/v1/chat/completions",
    )
    assert ex.upstream_url == "http://127.0.0.1:9/v1/chat/completions" and ex.extra["target"] == "default"
    assert "accept-encoding" not in f.request.headers
    assert [(c.stage, c.path, c.before) for c in ex.changes] == [("framing", "headers.accept-encoding", "gzip, br")]


def test_a_rewritten_body_gets_its_content_length_fixed() -> None:
    rt = reachable(runtime(config=CONFIG))
    f = flow(body={"model": "qwen", "messages": [], "stream": True})
    ex = recorded(f)
    route(rt, f)
    sent = orjson.loads(f.request.raw_content or b"")
    assert sent["model"] == "Qwen/Qwen3-32B" and f.request.port == 9
    assert f.request.headers["content-length"] == str(len(f.request.raw_content or b""))
    assert ex.served_model == "Qwen/Qwen3-32B" and ex.stream is True and ex.model == "qwen"


def test_an_unknown_model_is_answered_locally_with_the_capture_id() -> None:
    rt = reachable(runtime(config=CONFIG))
    f = flow(body={"model": "gpt-4o", "messages": []})
    ex = recorded(f)
    route(rt, f)
    assert f.response is not None and f.response.status_code == 404
    assert f.response.headers["x-tapfix-capture-id"] == ex.id
    error = orjson.loads(f.response.content)["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "model_not_found", "model")
    assert f.request.host == "127.0.0.1" and f.request.port == 8080  # never pointed anywhere


def test_models_is_answered_from_the_config() -> None:
    rt = runtime(config=CONFIG)
    f = flow("/v1/models", method="GET")
    recorded(f)
    route(rt, f)
    assert f.response is not None and f.response.status_code == 200
    assert {m["id"] for m in orjson.loads(f.response.content)["data"]} >= {"qwen", "glm"}


def test_guard_clauses_leave_foreign_and_answered_flows_alone() -> None:
    rt = reachable(runtime())
    untracked = flow(body={"model": "m"})  # no exchange: not a flow the recorder took
    answered = flow(response=json_response({"ok": True}))
    recorded(answered)
    dead = flow()
    recorded(dead)
    dead.live = False
    for f in (untracked, answered, dead):
        route(rt, f)
        assert (f.request.host, f.request.port) == ("127.0.0.1", 8080)
    assert answered.response is not None and answered.response.status_code == 200


@pytest.mark.parametrize("http2", [False, True])
@pytest.mark.parametrize("at", [("http", "127.0.0.1", 9), ("http", "127.0.0.1", 8080), ("https", "127.0.0.1", 9)])
def test_pointing_a_reverse_mode_request_at_its_upstream_forwards_the_same_head(
    at: tuple[str, str, int], http2: bool
) -> None:
    """Already pointed at the upstream (as mitmproxy's reverse mode points a request at the default one), the
    router skips the setters: what goes upstream is the same as when it sets them all (Host, authority)."""
    rt = runtime(mode="reverse")
    router = Router(rt)
    target = rt.targets["default"]
    flows = []
    for _ in range(2):
        f = flow(body={"model": "m"}, headers={"host": "client.example:8080"})
        f.request.scheme, f.request.host, f.request.port = at
        if http2:
            f.request.http_version, f.request.authority = "HTTP/2.0", "client.example:8080"
        flows.append(f)
    set_all, skipped = flows
    request = set_all.request
    request.scheme, request.host, request.port = target.scheme, target.host, target.port  # what the setters did
    request.path = target.join(request.path)
    router._name_the_upstream(set_all)
    router.point_at(skipped, target)
    assert skipped.request.data == set_all.request.data
