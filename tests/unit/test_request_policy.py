import json

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tapfix.proxy.config.file import Config, ConfigError, from_dict
from tapfix.proxy.request.policy import RequestPolicy
from tapfix.proxy.surfaces import surface_for

from tests.support import strategies
from tests.support.depth import examples

ENV = {"GPU0_KEY": "k-gpu0", "CLAUDE_KEY": "k-claude"}


@pytest.fixture
def gc_dir(tmp_path):
    folder = tmp_path / "Qwen3-32B"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.95, "top_k": 20}))
    return folder


@pytest.fixture
def policy(gc_dir):
    cfg = from_dict(
        {
            "upstreams": {
                "gpu0": {"base_url": "http://127.0.0.1:8000/v1", "engine": "vllm", "api_key_env": "GPU0_KEY"},
                "gpu1": {"base_url": "http://127.0.0.1:8001/v1", "engine": "llamacpp"},
                "claude": {
                    "base_url": "https://api.anthropic.com",
                    "engine": "anthropic",
                    "api_key_env": "CLAUDE_KEY",
                },
            },
            "models": {
                "qwen3-32b": {
                    "upstream": "gpu0",
                    "upstream_model": "Qwen/Qwen3-32B",
                    "aliases": ["qwen"],
                    "generation_config": str(gc_dir),
                    "sampling": {"presence_penalty": 1.5},
                    "reasoning": {"template_var": "enable_thinking"},
                },
                "glm": {"upstream": "gpu1", "reasoning": {"levels": ["high", "max"]}},
                "claude": {"upstream": "claude"},
            },
        }
    )
    return RequestPolicy(cfg, environ=ENV)


def test_opencode_like_request_end_to_end(policy):
    body = (
        b'{"model":"qwen","messages":[{"role":"user","content":"\\u00e9 \\"hi\\""}],'
        b'"stream":true,"stream_options":{"include_usage":true},"max_tokens":16384,"enable_thinking":true}'
    )
    out = policy.apply("/v1/chat/completions", body, {"Authorization": "Bearer client", "User-Agent": "omp/18.2.3"})
    assert out.error is None
    assert out.upstream.name == "gpu0"
    assert (out.model, out.served_model, out.surface) == ("qwen", "Qwen/Qwen3-32B", "chat")
    assert out.parsed == orjson.loads(body)
    assert out.flags == {"no_sampling_params"}
    assert out.body == (
        b'{"model":"Qwen/Qwen3-32B","messages":[{"role":"user","content":"\\u00e9 \\"hi\\""}],'
        b'"stream":true,"stream_options":{"include_usage":true},"max_tokens":16384,'
        b'"temperature":0.6,"top_p":0.95,"top_k":20,"presence_penalty":1.5,'
        b'"chat_template_kwargs":{"enable_thinking":true}}'
    )
    assert [(c.stage, c.kind, c.path) for c in out.changes] == [
        ("router", "rename", "$.model"),
        ("sampling", "inject", "$.temperature"),
        ("sampling", "inject", "$.top_p"),
        ("sampling", "inject", "$.top_k"),
        ("sampling", "inject", "$.presence_penalty"),
        ("reasoning", "drop", "$.enable_thinking"),
        ("reasoning", "inject", "$.chat_template_kwargs.enable_thinking"),
    ]
    assert out.upstream_headers == {"authorization": "Bearer k-gpu0"}
    assert out.remove_headers == ["x-api-key", "api-key"]


def test_unchanged_request_is_the_same_object(policy):
    body = b'{ "model" : "glm", "temperature": 0.2, "messages": [] }'
    out = policy.apply("/v1/chat/completions", body, {})
    assert out.body is body and out.changes == [] and out.flags == set()
    assert out.upstream.name == "gpu1" and out.upstream_headers == {} and out.remove_headers == []


def test_unknown_model_answers_404(policy):
    out = policy.apply("/v1/chat/completions", b'{"model":"gpt-4o","messages":[]}', {})
    assert out.error.status == 404 and orjson.loads(out.error.body)["error"]["code"] == "model_not_found"
    assert out.model == "gpt-4o"


def test_reasoning_clamped_to_model_levels(policy):
    out = policy.apply("/chat/completions", b'{"model":"glm","reasoning_effort":"low"}', {})
    assert out.body == b'{"model":"glm","reasoning_effort":"high"}'


def test_anthropic_upstream_gets_x_api_key(policy):
    out = policy.apply("/v1/messages?beta=true", b'{"model":"claude","max_tokens":5,"messages":[]}', {"x-api-key": "c"})
    assert out.surface == "messages"
    assert out.upstream_headers == {"x-api-key": "k-claude"}
    assert out.remove_headers == ["authorization", "api-key"]
    assert "no_sampling_params" not in out.flags


def test_missing_credential_is_flagged_not_fatal(gc_dir):
    cfg = Config.quick("http://127.0.0.1:8000/v1", upstream_key_env="NOPE")
    out = RequestPolicy(cfg, environ={}).apply("/v1/chat/completions", b'{"model":"x"}', {})
    assert "upstream_credential_missing" in out.flags and out.upstream_headers == {}
    out = RequestPolicy(cfg, environ={"NOPE": "k"}).apply("/v1/chat/completions", b'{"model":"x"}', {})
    assert out.upstream_headers == {"authorization": "Bearer k"} and out.upstream is None


@pytest.mark.parametrize(
    ("path", "surface"),
    [
        ("/v1/chat/completions", "chat"),
        ("/chat/completions", "chat"),
        ("/proxy/abc/v1/chat/completions", "chat"),
        ("/v1/completions", "completions"),
        ("/v1/responses", "responses"),
        ("/v1/messages?beta=true", "messages"),
        ("/v1/models", None),
        ("/v1/embeddings", None),
        ("/v1/responses/resp_1", None),
        ("/api/chat", None),
        ("/v1/messages/count_tokens", None),
    ],
)
def test_surface_for(path, surface):
    assert surface_for(path) == surface


def test_other_paths_are_untouched_but_routed(policy):
    body = b'{"model":"qwen","input":"x"}'
    out = policy.apply("/v1/embeddings", body, {})
    assert out.body is body and out.changes == [] and out.error is None
    assert out.upstream.name == "gpu0"
    out = policy.apply("/v1/embeddings", b'{"model":"nope"}', {})
    assert out.error is None and out.upstream is None


@pytest.mark.parametrize(
    ("body", "flag"),
    [
        (b"", "empty_request_body"),
        (b"{not json", "malformed_request_body"),
        (b"[1, 2]", "malformed_request_body"),
        (b'"x"', "malformed_request_body"),
    ],
)
def test_bodies_that_are_not_objects(body, flag):
    quick = RequestPolicy(Config.quick("http://127.0.0.1:8000/v1", engine="vllm"), environ={})
    out = quick.apply("/v1/chat/completions", body, {})
    assert out.body is body and flag in out.flags and out.error is None and out.changes == []


def test_malformed_body_with_several_upstreams_is_a_clear_400(policy):
    out = policy.apply("/v1/chat/completions", b"{oops", {})
    assert out.error.status == 400 and "malformed_request_body" in out.flags
    assert orjson.loads(out.error.body)["error"]["type"] == "invalid_request_error"


def test_encoded_body_is_not_touched():
    quick = RequestPolicy(Config.quick("http://x", engine="vllm"), environ={})
    body = b"\x1f\x8b\x08\x00"
    out = quick.apply("/v1/chat/completions", body, {"Content-Encoding": "gzip"})
    assert out.body is body and out.flags == {"encoded_request_body"}


def test_quick_mode_fills_from_generation_config(gc_dir):
    quick = RequestPolicy(Config.quick("http://x", engine="ollama", generation_config=gc_dir), environ={})
    out = quick.apply("/v1/chat/completions", b'{"model":"qwen3:32b","reasoning_effort":"minimal"}', {})
    assert orjson.loads(out.body) == {
        "model": "qwen3:32b",
        "reasoning_effort": "low",
        "temperature": 0.6,
        "top_p": 0.95,
    }
    assert out.served_model == "qwen3:32b" and out.upstream is None


def test_unusable_generation_config_fails_at_start(tmp_path):
    with pytest.raises(ConfigError, match="--generation-config"):
        RequestPolicy(Config.quick("http://x", generation_config=tmp_path / "missing"))


def test_reject_unmappable_answers_400():
    cfg = from_dict(
        {
            "upstreams": {"u": {"base_url": "http://x", "engine": "vllm"}},
            "models": {"m": {"reasoning": {"reject_unmappable": True}}},
        }
    )
    out = RequestPolicy(cfg, environ={}).apply("/v1/chat/completions", b'{"model":"m","reasoning_effort":"turbo"}', {})
    assert out.error.status == 400 and [c.kind for c in out.changes] == ["reject"]


def test_big_integers_still_splice():
    quick = RequestPolicy(Config.quick("http://x", engine="vllm", reasoning_dialect="vllm"), environ={})
    body = b'{"model":"m","seed":123456789012345678901234567890,"reasoning_effort":50}'
    out = quick.apply("/v1/chat/completions", body, {})
    assert out.body == b'{"model":"m","seed":123456789012345678901234567890,"reasoning_effort":"medium"}'


def test_five_megabyte_request_is_fast(policy):
    import time

    messages = [{"role": "user", "content": "y" * 4000 + ' {"a": [1]} \\ '} for _ in range(1250)]
    body = json.dumps({"model": "qwen", "messages": messages, "stream": True}).encode()
    start = time.perf_counter()
    out = policy.apply("/v1/chat/completions", body, {})
    assert time.perf_counter() - start < 0.5
    assert out.body[: body.index(b'"messages"')] != body[: body.index(b'"messages"')]  # model renamed
    assert out.body.index(b'"messages"') == body.index(b'"messages"') + len("Qwen/Qwen3-32B") - len("qwen")


json_values = strategies.json_values(st.text(max_size=8), max_leaves=10)
known_keys = st.sampled_from(["model", "temperature", "top_p", "max_tokens", *strategies.REASONING_KEYS, "messages"])
request_bodies = st.dictionaries(known_keys | st.text(max_size=5), json_values, max_size=6)
paths = st.sampled_from(["/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/completions", "/x"])


@settings(max_examples=examples(200), suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    st.binary(max_size=200) | request_bodies.map(lambda d: json.dumps(d).encode()),
    paths,
    st.sampled_from(["qwen", "glm", "claude", "nope"]),
)
def test_never_raises(policy, body, path, model):
    if body.startswith(b"{") and b'"model"' not in body:
        body = b'{"model":' + json.dumps(model).encode() + (b"," + body[1:] if body != b"{}" else b"}")
    out = policy.apply(path, body, {})
    assert "request_policy_error" not in out.flags
    if out.body is not body:
        assert orjson.loads(out.body) is not None
        assert "request_reserialized" not in out.flags
