import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.config.model import LEVELS, ReasoningSettings
from tapfix.proxy.jsonsplice import apply_to_dict, splice
from tapfix.proxy.request.reasoning import apply_reasoning, detect
from tapfix.proxy.request.reasoning_levels import (
    clamp_level,
    level_from_budget,
    level_from_number,
)

from tests.support import strategies

TV = {"template_var": "enable_thinking"}


def forward(body, dialect, surface="chat", **settings):
    result = apply_reasoning(body, ReasoningSettings(dialect=dialect, **settings), surface)
    assert result.error is None
    return apply_to_dict(body, result.edits), result.changes


# One row per client form; one column per dialect: what reaches the upstream (besides "model").
# "=" means unchanged.
FORMS = {
    "effort string": {"reasoning_effort": "high"},
    "effort 0-100": {"reasoning_effort": 50},
    "effort 0-1": {"reasoning_effort": 0.9},
    "effort numeric string": {"reasoning_effort": "70"},
    "effort JS float 1.0": {"reasoning_effort": 1.0},
    "openrouter reasoning": {"reasoning": {"effort": "low", "exclude": True}},
    "openrouter max_tokens": {"reasoning": {"max_tokens": 2048}},
    "anthropic budget": {"thinking": {"type": "enabled", "budget_tokens": 12384}},
    "anthropic adaptive": {"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}},
    "kwargs off": {"chat_template_kwargs": {"enable_thinking": False}},
    "qwen top-level (omp)": {"enable_thinking": True},
    "ollama think": {"think": "high"},
    "omp thinking off": {"reasoning_effort": "minimal"},
}
DIALECT_COLUMNS = ("vllm", "sglang", "llamacpp", "ollama", "tabbyapi", "openai", "int", "template")
E = "reasoning_effort"
B = "thinking_budget_tokens"  # llama.cpp's
ON = {"chat_template_kwargs": {"enable_thinking": True}}  # the template dialect's switch
VARS_ON = {"template_vars": {"enable_thinking": True}}  # TabbyAPI's
TABLE = {
    "effort string": ["=", "=", "=", "=", "=", "=", {E: 75}, ON],
    "effort 0-100": [{E: "medium"}] * 6 + ["=", ON],
    "effort 0-1": [{E: "high"}] * 6 + [{E: 75}, ON],
    "effort numeric string": [{E: "high"}] * 6 + [{E: 75}, ON],
    "effort JS float 1.0": [{E: "low"}] * 6 + [{E: 25}, ON],
    "openrouter reasoning": [{E: "low"}] * 3 + ["=", VARS_ON, {E: "low"}, {E: 25}, ON],
    "openrouter max_tokens": [{E: "low"}] * 2 + [{E: "low", B: 2048}, {E: "low"}, VARS_ON, {E: "low"}, {E: 25}, ON],
    "anthropic budget": [{E: "high"}] * 2 + [{E: "high", B: 12384}, {E: "high"}, VARS_ON, {E: "high"}, {E: 75}, ON],
    "anthropic adaptive": [{E: "max"}] * 3 + [{E: "high"}, VARS_ON, {E: "xhigh"}, {E: 100}, ON],
    "kwargs off": ["=", "=", "=", {E: "none"}, "=", {E: "none"}, {E: 0}, "="],
    "qwen top-level (omp)": [{E: "medium"}] * 4 + ["=", {E: "medium"}, {E: 50}, ON],
    "ollama think": [{E: "high"}] * 4 + [VARS_ON, {E: "high"}, {E: 75}, ON],
    "omp thinking off": ["=", "=", "=", {E: "low"}, "=", "=", {E: 10}, ON],
}
ROWS = [
    (form, dialect, expected)
    for form, cells in TABLE.items()
    for dialect, expected in zip(DIALECT_COLUMNS, cells, strict=True)
]


@pytest.mark.parametrize(("form", "dialect", "expected"), ROWS)
def test_client_form_by_dialect(form, dialect, expected):
    body = {"model": "m", **FORMS[form]}
    out, changes = forward(body, dialect)
    assert out == (body if expected == "=" else {"model": "m", **expected})
    assert (changes == []) == (expected == "=")
    assert all(c.stage == "reasoning" and c.kind in ("inject", "override", "clamp", "drop") for c in changes)


# (dialect, settings, surface, client fields, forwarded fields)
SPECIAL = [
    # a template variable the engine does not derive by itself
    ("vllm", TV, "chat", {"enable_thinking": True}, {"chat_template_kwargs": {"enable_thinking": True}}),
    (
        "vllm",
        {"template_var": "thinking"},
        "chat",
        {E: "high"},
        {E: "high", "chat_template_kwargs": {"thinking": True}},
    ),
    ("llamacpp", TV, "chat", {E: "none"}, {E: "none", "chat_template_kwargs": {"enable_thinking": False}}),
    (
        "llamacpp",
        TV,
        "chat",
        {"chat_template_kwargs": {"enable_thinking": False}},
        {"chat_template_kwargs": {"enable_thinking": False}},
    ),
    ("tabbyapi", TV, "chat", {E: "none"}, {E: "none", "template_vars": {"enable_thinking": False}}),
    (
        "tabbyapi",
        TV,
        "chat",
        {E: "high", "chat_template_kwargs": {"x": 1}},
        {E: "high", "chat_template_kwargs": {"x": 1, "enable_thinking": True}},
    ),
    # GLM-5.2: only high and max, read as a template variable
    (
        "sglang",
        {"template_var": "reasoning_effort", "levels": ("high", "max")},
        "chat",
        {E: "low"},
        {E: "high", "chat_template_kwargs": {"reasoning_effort": "high"}},
    ),
    (
        "llamacpp",
        {"budgets": {"high": 16384}},
        "chat",
        {E: "high"},
        {E: "high", "thinking_budget_tokens": 16384},
    ),
    ("int", {"field": "effort_pct"}, "chat", {E: "high"}, {"effort_pct": 75}),
    ("int", {"field": "reasoning.level"}, "chat", {"think": False}, {"reasoning": {"level": 0}}),
    ("vllm", {"default_level": "high"}, "chat", {"reasoning": {"enabled": True}}, {E: "high"}),
    # an emptied foreign container goes whole; one with other keys keeps them
    (
        "openai",
        {},
        "chat",
        {"chat_template_kwargs": {"enable_thinking": True, "x": 1}},
        {"chat_template_kwargs": {"x": 1}, E: "medium"},
    ),
    ("openai", {}, "chat", {"output_config": {"effort": "low"}}, {E: "low"}),
    # Responses: reasoning.effort is the native form
    (
        "vllm",
        {},
        "responses",
        {"reasoning": {"effort": "high", "summary": "auto"}},
        {"reasoning": {"effort": "high", "summary": "auto"}},
    ),
    ("openai", {}, "responses", {E: "max"}, {"reasoning": {"effort": "xhigh"}}),
    (
        "ollama",
        {},
        "responses",
        {"reasoning": {"effort": "minimal", "summary": "auto"}},
        {"reasoning": {"effort": "low", "summary": "auto"}},
    ),
    (
        "sglang",
        {},
        "responses",
        {"reasoning": {"max_tokens": 9000, "summary": "auto"}},
        {"reasoning": {"summary": "auto", "effort": "medium"}},
    ),
    ("vllm", {}, "responses", {"reasoning": {"max_tokens": 500}}, {"reasoning": {"effort": "minimal"}}),
    (
        "ollama",
        {},
        "chat",
        {"reasoning": {"effort": "high", "enabled": True}},
        {"reasoning": {"effort": "high"}},
    ),
    # Z.ai's thinking{type: enabled} without a budget
    ("vllm", {}, "chat", {"thinking": {"type": "enabled", "clear_thinking": False}}, {E: "medium"}),
    ("vllm", {}, "chat", {"thinking": {"type": "disabled"}}, {E: "none"}),
    # the model accepts no "none": off becomes the nearest level
    ("vllm", {"levels": ("low", "high")}, "chat", {E: "none"}, {E: "low"}),
]


@pytest.mark.parametrize(("dialect", "settings", "surface", "client", "forwarded"), SPECIAL)
def test_special_cases(dialect, settings, surface, client, forwarded):
    out, _ = forward({"model": "m", **client}, dialect, surface, **settings)
    assert out == {"model": "m", **forwarded}


@pytest.mark.parametrize("dialect", [None, "passthrough"])
@pytest.mark.parametrize("form", list(FORMS))
def test_without_dialect_everything_passes_through(dialect, form):
    result = apply_reasoning({"model": "m", **FORMS[form]}, ReasoningSettings(dialect=dialect), "chat")
    assert result.edits == [] and result.changes == []


def test_messages_endpoint_is_left_alone():
    body = {"model": "m", "thinking": {"type": "enabled", "budget_tokens": 2048}}
    assert apply_reasoning(body, ReasoningSettings(dialect="vllm"), "messages").edits == []


def test_no_reasoning_field_no_change():
    assert apply_reasoning({"model": "m", "messages": []}, ReasoningSettings(dialect="vllm"), "chat").changes == []


def test_change_records_for_a_translation():
    _, changes = forward({"model": "m", "thinking": {"type": "enabled", "budget_tokens": 12384}}, "vllm")
    drop, inject = changes
    assert (drop.kind, drop.path, drop.before, drop.after) == (
        "drop",
        "$.thinking",
        {"type": "enabled", "budget_tokens": 12384},
        None,
    )
    assert "translated to $.reasoning_effort" in drop.reason
    assert (inject.kind, inject.path, inject.before, inject.after) == (
        "inject",
        "$.reasoning_effort",
        None,
        "high",
    )
    assert inject.reason == "reasoning on (high) from $.thinking"


def test_clamp_is_recorded_as_clamp():
    _, [change] = forward({"reasoning_effort": "minimal"}, "ollama")
    assert (change.kind, change.before, change.after) == ("clamp", "minimal", "low")


@pytest.mark.parametrize("value", ["turbo", 150, -3, 1.5, [1], {"a": 1}, None])
def test_unmappable_passes_through_with_a_warning(value):
    body = {"model": "m", "reasoning_effort": value}
    out, changes = forward(body, "vllm")
    assert out == body
    [warning] = changes
    assert (warning.kind, warning.path, warning.before, warning.after) == (
        "warning",
        "$.reasoning_effort",
        value,
        value,
    )


def test_unmappable_is_a_400_when_configured():
    result = apply_reasoning(
        {"model": "m", "thinking": {"type": "sometimes"}},
        ReasoningSettings(dialect="vllm", reject_unmappable=True),
        "chat",
    )
    assert result.error is not None
    error = orjson.loads(result.error.body)["error"]
    assert result.error.status == 400 and result.error.error == error
    assert error["type"] == "invalid_request_error" and error["param"] == "thinking"
    assert "$.thinking" in error["message"] and "none, minimal, low" in error["message"]
    assert [(c.kind, c.path) for c in result.changes] == [("reject", "$.thinking")]


def test_unmappable_form_beside_a_good_one_still_translates_the_good_one():
    out, changes = forward({"model": "m", "think": "sometimes", "reasoning": {"effort": "low"}}, "vllm")
    assert out == {"model": "m", "think": "sometimes", "reasoning_effort": "low"}
    assert [c.kind for c in changes] == ["warning", "drop", "inject"]


@pytest.mark.parametrize(
    ("value", "level"),
    [
        (0, "none"),
        (1, "low"),
        (33, "low"),
        (34, "medium"),
        (66, "medium"),
        (67, "high"),
        (100, "high"),
        (1.0, "low"),
        (0.0, "none"),
        (100.0, "high"),
        (0.05, "low"),
        (0.33, "low"),
        (0.34, "medium"),
        (0.5, "medium"),
        (0.67, "high"),
        (0.99, "high"),
        (101, None),
        (-1, None),
        (1.5, None),
        (-0.5, None),
        (True, None),
        ("50", None),
    ],
)
def test_number_scale(value, level):
    assert level_from_number(value) == level


@pytest.mark.parametrize(
    ("text", "level"),
    [
        ("50", "medium"),
        ("1.0", "low"),
        ("0.5", "medium"),
        (" HIGH ", "high"),
        ("off", "none"),
        ("xhigh", "xhigh"),
        ("max", "max"),
    ],
)
def test_string_values(text, level):
    [signal] = detect({"reasoning_effort": text})
    assert signal.level == level


@pytest.mark.parametrize(
    ("tokens", "level"),
    [
        (-5, "none"),
        (0, "none"),
        (1, "minimal"),
        (1024, "minimal"),
        (1025, "low"),
        (2048, "low"),
        (4095, "low"),
        (4096, "medium"),
        (8192, "medium"),
        (12287, "medium"),
        (12288, "high"),
        (12384, "high"),
        (16384, "high"),
        (10**6, "high"),
    ],
)
def test_budget_thresholds(tokens, level):
    assert level_from_budget(tokens) == level


@pytest.mark.parametrize(
    ("level", "accepted", "expected"),
    [
        ("low", ("high", "max"), "high"),
        ("medium", ("low", "high"), "high"),
        ("none", ("low", "high"), "low"),
        ("max", LEVELS[:-1], "xhigh"),
        ("minimal", ("none", "low", "medium", "high"), "low"),
        ("xhigh", ("none", "low", "medium", "high"), "high"),
        ("medium", ("medium",), "medium"),
    ],
)
def test_clamp_nearest_ties_upward(level, accepted, expected):
    assert clamp_level(level, accepted) == expected


def test_precedence_explicit_template_variable_first():
    signals = detect(
        {
            "think": True,
            "enable_thinking": False,
            "reasoning_effort": "low",
            "chat_template_kwargs": {"enable_thinking": True},
        }
    )
    assert [s.path for s in signals] == [
        ("chat_template_kwargs", "enable_thinking"),
        ("reasoning_effort",),
        ("enable_thinking",),
        ("think",),
    ]


def test_spliced_bytes_change_only_reasoning_keys():
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "enable_thinking": true, "stream": true}'
    result = apply_reasoning(
        orjson.loads(body), ReasoningSettings(dialect="vllm", template_var="enable_thinking"), "chat"
    )
    assert splice(body, result.edits) == (
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true, '
        b'"chat_template_kwargs": {"enable_thinking": true}}'
    )


json_values = strategies.json_values(st.text(max_size=6), max_leaves=6)
reasoning_keys = st.sampled_from([*strategies.REASONING_KEYS, "template_vars", "output_config", "model"])


@given(
    st.dictionaries(reasoning_keys, json_values, max_size=5),
    st.sampled_from(DIALECT_COLUMNS),
    st.sampled_from(["chat", "responses", "completions"]),
)
def test_never_raises_and_edits_splice(body, dialect, surface):
    result = apply_reasoning(body, ReasoningSettings(dialect=dialect, template_var="enable_thinking"), surface)
    raw = json.dumps(body).encode()
    assert json.loads(splice(raw, result.edits)) == apply_to_dict(body, result.edits)
