"""Reasoning on `/v1/messages`: Anthropic's thinking forms mapped to what vLLM/SGLang/llama.cpp read."""

from __future__ import annotations

import pytest
from tapfix.proxy.config.model import ReasoningSettings
from tapfix.proxy.jsonsplice import apply_to_dict
from tapfix.proxy.request.reasoning import apply_reasoning


def forward(body: dict, **settings) -> tuple[dict, list]:
    result = apply_reasoning(body, ReasoningSettings(**{"dialect": "vllm", **settings}), "messages")
    return apply_to_dict(dict(body), result.edits), result.changes


@pytest.mark.parametrize(
    ("client", "forwarded"),
    [
        (
            {"thinking": {"type": "enabled", "budget_tokens": 2048}},
            {"thinking": {"type": "enabled", "budget_tokens": 2048}},
        ),
        (
            {"max_tokens": 4000, "thinking": {"type": "enabled", "budget_tokens": 500}},
            {"max_tokens": 4000, "thinking": {"type": "enabled", "budget_tokens": 1024}},
        ),
        (
            {"max_tokens": 4000, "thinking": {"type": "enabled", "budget_tokens": 8000}},
            {"max_tokens": 4000, "thinking": {"type": "enabled", "budget_tokens": 3999}},
        ),
        (
            {"max_tokens": 64000, "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}},
            {
                "max_tokens": 64000,
                "thinking": {"type": "enabled", "budget_tokens": 16384},
                "output_config": {"effort": "high"},
            },
        ),
        (
            {"max_tokens": 64000, "thinking": {"type": "adaptive", "display": "summarized"}},
            {
                "max_tokens": 64000,
                "thinking": {"type": "adaptive", "display": "summarized"} | {"type": "enabled", "budget_tokens": 8192},
            },
        ),
        ({"output_config": {"effort": "minimal"}}, {"output_config": {"effort": "low"}}),
        ({"output_config": {"effort": "none"}}, {}),
        ({"thinking": {"type": "disabled"}}, {"thinking": {"type": "disabled"}}),
    ],
)
def test_messages_forms(client, forwarded):
    out, _ = forward({"model": "m", **client})
    assert out == {"model": "m", **forwarded}


def test_small_max_tokens_only_warns():
    body = {"model": "m", "max_tokens": 800, "thinking": {"type": "enabled", "budget_tokens": 2048}}
    out, changes = forward(body)
    assert out == body and [c.kind for c in changes] == ["warning"]


def test_template_variable_is_set_for_the_model_family():
    out, _ = forward(
        {"model": "m", "thinking": {"type": "enabled", "budget_tokens": 2048}}, template_var="enable_thinking"
    )
    assert out["chat_template_kwargs"] == {"enable_thinking": True}
    out, _ = forward({"model": "m", "thinking": {"type": "disabled"}}, template_var="enable_thinking")
    assert out["chat_template_kwargs"] == {"enable_thinking": False}
    body = {"model": "m", "thinking": {"type": "disabled"}, "chat_template_kwargs": {"enable_thinking": True}}
    assert forward(body, template_var="enable_thinking")[0] == body


def test_without_a_dialect_nothing_changes():
    body = {"model": "m", "thinking": {"type": "adaptive"}}
    assert apply_reasoning(body, ReasoningSettings(dialect=None), "messages").edits == []
