import json

import orjson
import pytest
from tapfix.proxy.config.model import ParamPolicy
from tapfix.proxy.jsonsplice import apply_to_dict, splice
from tapfix.proxy.request.sampling import (
    GenerationConfigError,
    SamplingPolicy,
    apply_sampling,
    load_generation_config,
    sent_sampling,
    wire_name,
)

QWEN = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "repetition_penalty": 1.0}


def run(body, policy, surface="chat", engine="vllm"):
    edits, changes = apply_sampling(body, policy, surface, engine)
    return apply_to_dict(body, edits), changes


def gc_policy(values=QWEN, configured=None):
    return SamplingPolicy.build(configured or {}, values, "generation_config.json of Qwen3-32B")


# (engine, surface, client body, expected forwarded body): generation_config values fill only what
# the engine and the endpoint accept, under the engine's name.
FILL_TABLE = [
    ("vllm", "chat", {"model": "m"}, {"model": "m", **QWEN}),
    ("sglang", "chat", {"model": "m"}, {"model": "m", **QWEN}),
    ("tabbyapi", "chat", {"model": "m"}, {"model": "m", **QWEN}),
    (
        "llamacpp",
        "chat",
        {"model": "m"},
        {"model": "m", "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "repeat_penalty": 1.0},
    ),
    ("ollama", "chat", {"model": "m"}, {"model": "m", "temperature": 0.6, "top_p": 0.95}),
    ("openai", "chat", {"model": "m"}, {"model": "m", "temperature": 0.6, "top_p": 0.95}),
    (None, "chat", {"model": "m"}, {"model": "m", **QWEN}),
    ("vllm", "completions", {"model": "m", "prompt": "x"}, {"model": "m", "prompt": "x", **QWEN}),
    (
        "vllm",
        "responses",
        {"model": "m", "input": "x"},
        {"model": "m", "input": "x", "temperature": 0.6, "top_p": 0.95},
    ),
    (
        "vllm",
        "messages",
        {"model": "m", "max_tokens": 10},
        {"model": "m", "max_tokens": 10, "temperature": 0.6, "top_p": 0.95, "top_k": 20},
    ),
    ("anthropic", "messages", {"model": "m"}, {"model": "m", "temperature": 0.6, "top_p": 0.95, "top_k": 20}),
    # what the client sent is kept
    (
        "vllm",
        "chat",
        {"model": "m", "temperature": 0.2, "top_k": 5},
        {
            "model": "m",
            "temperature": 0.2,
            "top_k": 5,
            "top_p": 0.95,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
        },
    ),
    # a null counts as omitted
    (
        "ollama",
        "chat",
        {"model": "m", "temperature": None},
        {"model": "m", "temperature": 0.6, "top_p": 0.95},
    ),
]


@pytest.mark.parametrize(("engine", "surface", "body", "expected"), FILL_TABLE)
def test_fill_from_generation_config(engine, surface, body, expected):
    out, changes = run(body, gc_policy(), surface, engine)
    assert out == expected
    assert all(c.stage == "sampling" and c.kind == "inject" for c in changes)
    assert all(c.reason == "generation_config.json of Qwen3-32B" for c in changes)
    assert {c.path for c in changes} == {f"$.{k}" for k in expected if body.get(k) is None}


def test_change_record_shape():
    _, changes = run({"model": "m"}, gc_policy({"top_p": 0.95}))
    assert [c.as_dict() for c in changes] == [
        {
            "stage": "sampling",
            "kind": "inject",
            "path": "$.top_p",
            "before": None,
            "after": 0.95,
            "reason": "generation_config.json of Qwen3-32B",
        }
    ]


@pytest.mark.parametrize("key", ["max_tokens", "max_completion_tokens", "max_output_tokens"])
def test_any_max_tokens_key_counts_as_the_parameter(key):
    policy = gc_policy({"max_tokens": 4096})
    out, changes = run({"model": "m", key: 100}, policy)
    assert out == {"model": "m", key: 100} and changes == []


@pytest.mark.parametrize(
    ("engine", "surface", "key"),
    [
        ("vllm", "chat", "max_tokens"),
        ("openai", "chat", "max_completion_tokens"),
        ("vllm", "responses", "max_output_tokens"),
        ("vllm", "completions", "max_tokens"),
        ("vllm", "messages", "max_tokens"),
    ],
)
def test_max_new_tokens_is_written_under_the_endpoint_name(engine, surface, key):
    out, _ = run({"model": "m"}, gc_policy({"max_tokens": 4096}), surface, engine)
    assert out[key] == 4096
    assert wire_name("max_tokens", engine, surface) == key


def test_config_value_wins_over_generation_config_and_penalties_come_only_from_config():
    configured = {
        "temperature": ParamPolicy("fill", 0.7, reason="config models.q.sampling.temperature"),
        "presence_penalty": ParamPolicy("fill", 1.5, reason="config models.q.sampling.presence_penalty"),
    }
    policy = SamplingPolicy.build(configured, {"temperature": 0.6, "top_p": 0.95}, "generation_config.json of Q")
    out, changes = run({"model": "m"}, policy)
    assert out == {"model": "m", "temperature": 0.7, "top_p": 0.95, "presence_penalty": 1.5}
    reasons = {c.path: c.reason for c in changes}
    assert reasons["$.temperature"] == "config models.q.sampling.temperature"
    assert reasons["$.top_p"] == "generation_config.json of Q"


def test_table_without_value_takes_generation_config_value():
    policy = SamplingPolicy.build({"top_p": ParamPolicy("override", reason="cfg")}, {"top_p": 0.8}, "gc")
    out, changes = run({"model": "m", "top_p": 1.0}, policy)
    assert out["top_p"] == 0.8
    assert changes[0].kind == "override" and changes[0].before == 1.0 and changes[0].reason == "gc"


# (policy, client body, expected body, expected change kinds)
MODES = [
    (ParamPolicy("override", 0.5, reason="r"), {"temperature": 1.0}, {"temperature": 0.5}, ["override"]),
    (ParamPolicy("override", 0.5, reason="r"), {}, {"temperature": 0.5}, ["inject"]),
    (ParamPolicy("override", 0.5, reason="r"), {"temperature": 0.5}, {"temperature": 0.5}, []),
    (
        ParamPolicy("clamp", min=0.1, max=0.9, reason="r"),
        {"temperature": 1.2},
        {"temperature": 0.9},
        ["clamp"],
    ),
    (
        ParamPolicy("clamp", min=0.1, max=0.9, reason="r"),
        {"temperature": 0.0},
        {"temperature": 0.1},
        ["clamp"],
    ),
    (ParamPolicy("clamp", min=0.1, max=0.9, reason="r"), {"temperature": 0.5}, {"temperature": 0.5}, []),
    (ParamPolicy("clamp", max=0.9, reason="r"), {}, {}, []),
    (ParamPolicy("clamp", max=0.9, reason="r"), {"temperature": "hot"}, {"temperature": "hot"}, []),
    (ParamPolicy("fill", 0.6, max=0.9, reason="r"), {"temperature": 1.5}, {"temperature": 0.9}, ["clamp"]),
    (ParamPolicy("fill", 0.6, max=0.9, reason="r"), {}, {"temperature": 0.6}, ["inject"]),
    (ParamPolicy("drop", reason="r"), {"temperature": 0.3, "x": 1}, {"x": 1}, ["drop"]),
    (ParamPolicy("drop", reason="r"), {}, {}, []),
]


@pytest.mark.parametrize(("rule", "body", "expected", "kinds"), MODES)
def test_modes(rule, body, expected, kinds):
    out, changes = run(body, SamplingPolicy({"temperature": rule}))
    assert out == expected
    assert [c.kind for c in changes] == kinds


def test_clamp_records_bounds_and_values():
    policy = SamplingPolicy({"top_p": ParamPolicy("clamp", max=0.95, reason="config models.q.sampling.top_p")})
    _, [change] = run({"top_p": 1.0}, policy)
    assert (change.path, change.before, change.after) == ("$.top_p", 1.0, 0.95)
    assert change.reason == "config models.q.sampling.top_p: within [-, 0.95]"


def test_drop_max_tokens_removes_every_spelling():
    policy = SamplingPolicy({"max_tokens": ParamPolicy("drop", reason="r")})
    out, changes = run({"max_tokens": 1, "max_completion_tokens": 2, "m": 0}, policy)
    assert out == {"m": 0} and len(changes) == 2


def test_llamacpp_renames_client_repetition_penalty():
    out, changes = run({"repetition_penalty": 1.1}, SamplingPolicy(), engine="llamacpp")
    assert out == {"repeat_penalty": 1.1}
    assert changes[0].kind == "rename"
    # and the client's value counts: no second one is filled in
    out, _ = run({"repetition_penalty": 1.1}, gc_policy({"repetition_penalty": 1.05}), engine="llamacpp")
    assert out == {"repeat_penalty": 1.1}


@pytest.mark.parametrize(
    ("engine", "expected"),
    [("vllm", -1), ("sglang", -1), ("llamacpp", 0), ("tabbyapi", 0), ("anthropic", None)],
)
def test_top_k_off_is_spelled_per_engine(engine, expected):
    out, _ = run({}, gc_policy({"top_k": 0}), "messages" if engine == "anthropic" else "chat", engine)
    assert out.get("top_k") == expected


def test_splice_of_sampling_edits_keeps_client_bytes():
    body = b'{"model" : "m",\n "messages": [{"role":"user","content":"\\u00e9"}]}'
    edits, _ = apply_sampling(orjson.loads(body), gc_policy({"top_p": 0.95}), "chat", "vllm")
    assert (
        splice(body, edits) == b'{"model" : "m",\n "messages": [{"role":"user","content":"\\u00e9"}],\n "top_p": 0.95}'
    )


def test_sent_sampling():
    assert not sent_sampling({"model": "m", "max_tokens": 5, "presence_penalty": 1})
    assert not sent_sampling({"temperature": None})
    assert sent_sampling({"min_p": 0})


@pytest.mark.parametrize("as_folder", [True, False])
def test_load_generation_config_from_file_or_folder(tmp_path, as_folder):
    folder = tmp_path / "Qwen3-32B"
    folder.mkdir()
    data = {
        "temperature": 0.6,
        "top_k": 20,
        "max_new_tokens": 2048,
        "presence_penalty": 1.5,
        "do_sample": True,
        "top_p": "0.9",
        "eos_token_id": [1, 2],
    }
    (folder / "generation_config.json").write_text(json.dumps(data))
    values, label = load_generation_config(folder if as_folder else folder / "generation_config.json")
    assert values == {"temperature": 0.6, "top_k": 20, "max_tokens": 2048}
    assert label == "generation_config.json of Qwen3-32B"


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "cannot read"), ("{", "not valid JSON"), ("[1]", "expected a JSON object")],
)
def test_bad_generation_config(tmp_path, content, message):
    file = tmp_path / "generation_config.json"
    if content is not None:
        file.write_text(content)
    with pytest.raises(GenerationConfigError, match=message):
        load_generation_config(file)
