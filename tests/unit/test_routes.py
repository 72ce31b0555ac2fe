"""Issue 38: the routes' config, the decision core (request/routes.py), the breaker and the route checks."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.config.file import ConfigError, from_dict
from tapfix.proxy.config.routes import When
from tapfix.proxy.request.breaker import Breaker
from tapfix.proxy.request.route_checks import route_problems
from tapfix.proxy.request.routes import Facts, Knowledge, decide, facts_of, matches
from tapfix.proxy.request.routing import Route, resolve

ISSUE_EXAMPLE = {
    "upstreams": {
        "local": {"base_url": "http://127.0.0.1:8000/v1", "engine": "vllm"},
        "cloud": {"base_url": "https://api.example.com/v1", "engine": "openai", "api_key_env": "CLOUD_API_KEY"},
    },
    "models": {
        "coder": {
            "upstream": "local",
            "upstream_model": "qwen3.6-27b",
            "context_window": 131072,
            "routes": [
                {
                    "name": "long-context",
                    "when": {"prompt_tokens_over": 100000},
                    "upstream": "cloud",
                    "upstream_model": "deepseek-v4-flash",
                }
            ],
        },
        "claude-haiku-*": {"upstream": "local", "upstream_model": "qwen3.6-4b"},
    },
}


def config(**changes):
    data = json.loads(json.dumps(ISSUE_EXAMPLE))
    for key, value in changes.items():
        data["models"]["coder"][key] = value
        if value is None:
            del data["models"]["coder"][key]
    return from_dict(data)


def facts(tokens: int, **kw) -> Facts:
    return Facts(model="coder", prompt_tokens=tokens, prompt_source="test", **kw)


def test_the_issues_example_loads_with_its_route_and_glob_name():
    c = config()
    (rule,) = c.models["coder"].routes
    assert (rule.name, rule.upstreams, rule.upstream_model) == ("long-context", ("cloud",), "deepseek-v4-flash")
    assert rule.when.prompt_tokens_over == 100000


def test_a_glob_public_name_is_matched_after_exact_names_and_aliases():
    data = json.loads(json.dumps(ISSUE_EXAMPLE))
    data["models"]["claude-haiku-special"] = {"upstream": "cloud", "upstream_model": "x"}
    data["models"]["coder"]["aliases"] = ["claude-haiku-alias"]
    c = from_dict(data)
    for asked, public, served in (
        ("claude-haiku-4-5", "claude-haiku-*", "qwen3.6-4b"),
        ("claude-haiku-special", "claude-haiku-special", "x"),
        ("claude-haiku-alias", "coder", "qwen3.6-27b"),
    ):
        route = resolve(c, asked)
        assert isinstance(route, Route) and route.settings is not None
        assert (route.settings.name, route.served_model) == (public, served)
    assert not isinstance(resolve(c, "claude-opus-4"), Route)


def test_a_glob_name_without_upstream_model_passes_the_asked_name_on():
    data = json.loads(json.dumps(ISSUE_EXAMPLE))
    data["models"]["qwen*"] = {"upstream": "local"}
    route = resolve(from_dict(data), "qwen3-8b")
    assert isinstance(route, Route) and route.served_model == "qwen3-8b"


@pytest.mark.parametrize(
    ("route", "expected"),
    [
        ({"name": "r", "upstream": "nowhere"}, "models.coder.routes[0].upstream: found 'nowhere', expected one of"),
        (
            {"name": "r", "upstream": "cloud", "when": {"tokens_over": 5}},
            "models.coder.routes.0.when.tokens_over: found an unknown key, expected one of header, model, needs",
        ),
        ({"name": "default", "upstream": "cloud"}, "routes[0].name: found 'default'"),
        ({"name": "r", "upstream": "cloud", "when": {"needs": ["telepathy"]}}, "found 'telepathy'"),
        (
            {"name": "r", "upstream": "cloud", "when": {"prompt_tokens_over": 10, "prompt_tokens_under": 5}},
            "expected a range some prompt can be in",
        ),
        ({"upstream": "cloud"}, "models.coder.routes.0.name: missing"),
    ],
)
def test_bad_routes_are_clear_config_errors(route, expected):
    with pytest.raises(ConfigError) as raised:
        config(routes=[route])
    assert expected in str(raised.value)


def test_two_routes_of_one_name_are_refused():
    with pytest.raises(ConfigError, match=r"routes\[1\].name: found 'r', which another route"):
        config(routes=[{"name": "r", "upstream": "cloud"}, {"name": "r", "upstream": "local"}])


# -- the decision -----------------------------------------------------------------------------------------
def decide_for(c, f, **known):
    m = c.models["coder"]
    return decide(c, m, m.upstream_model, f, Knowledge(**known))


def test_without_the_credential_both_rejections_are_named_and_not_the_variable():
    d = decide_for(config(), facts(140210))
    assert d.taken is None
    assert d.message() == (
        'no route for model "coder" can take this request: long-context: no credential for upstream cloud; '
        "default: prompt 140,210 tokens > window 131,072"
    )
    assert "CLOUD_API_KEY" in d.record()["rejected"][0]["reason"]
    answer = d.answer("chat")
    assert b"CLOUD_API_KEY" not in answer.body
    assert answer.status == 400 and answer.error["code"] == "context_length_exceeded"  # the window was last
    assert answer.error["message"].startswith("This model's maximum context length is 131072 tokens.")
    messages = d.answer("messages")
    assert messages.error["type"] == "invalid_request_error" and "prompt is too long" in messages.error["message"]


def test_none_eligible_for_another_reason_is_a_503_no_eligible_route():
    c = config()
    d = decide_for(c, facts(140210), failed={"local": "unreachable"}, environ={})
    answer = d.answer("chat")
    assert (answer.status, answer.error["type"], answer.error["code"]) == (503, "server_error", "no_eligible_route")
    assert d.answer("messages").error["type"] == "overloaded_error"


def test_with_the_credential_long_goes_to_cloud_and_short_to_local():
    env = {"CLOUD_API_KEY": "k"}
    long = decide_for(config(), facts(140210), environ=env)
    assert long.taken is not None and (long.taken.route, long.taken.upstream) == ("long-context", "cloud")
    assert long.taken.served_model == "deepseek-v4-flash"
    short = decide_for(config(), facts(2000), environ=env)
    assert short.taken is not None and short.taken.route == "default" and short.unmatched == ["long-context"]


def test_a_model_its_upstream_does_not_serve_is_passed_over():
    d = decide_for(config(), facts(140210), environ={"CLOUD_API_KEY": "k"}, served={"cloud": frozenset({"other"})})
    assert d.rejected[0][1].kind == "served" and d.taken is None


def test_the_clamped_max_tokens_counts_against_the_window():
    d = decide_for(config(routes=[]), facts(131000, max_tokens=32000), max_tokens_floor=256)
    assert d.taken is None and d.rejected[0][1].message == "prompt 131,000 + max_tokens 256 tokens > window 131,072"
    ok = decide_for(config(routes=[]), facts(130000, max_tokens=32000), max_tokens_floor=256)
    assert ok.taken is not None  # max_tokens is clamped to what the window leaves


def test_needs_a_route_does_not_support_pass_it_over():
    c = config(routes=[{"name": "vision", "upstream": "cloud", "supports": ["tools"]}])
    d = decide_for(c, facts(10, needs=("images",)), environ={"CLOUD_API_KEY": "k"})
    assert d.rejected[0][1].message == "upstream cloud does not support images" and d.taken is not None
    assert d.taken.route == "default"  # nothing declared for local: assumed


def test_rules_match_headers_user_agent_model_and_needs_by_glob():
    when = When(header={"x-role": "sub*"}, user_agent="claude-cli/*", model="claude-haiku-*", needs=("tools",))
    base = {"headers": {"x-role": "subagent"}, "user_agent": "claude-cli/2.1", "needs": ("tools",)}
    assert matches(when, Facts("claude-haiku-4-5", 1, "t", **base))
    assert not matches(when, Facts("claude-sonnet-4", 1, "t", **base))
    assert not matches(when, Facts("claude-haiku-4-5", 1, "t", **{**base, "needs": ()}))
    assert not matches(when, Facts("claude-haiku-4-5", 1, "t", **{**base, "headers": {}}))


def test_request_facts_read_tools_images_reasoning_and_size():
    body = {
        "model": "coder",
        "max_tokens": 100,
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "reasoning_effort": "high",
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}],
    }
    f = facts_of("chat", body, {"User-Agent": "opencode/1", "X-Role": "main"}, "coder")
    assert f.needs == ("tools", "images", "reasoning")
    assert (f.max_tokens, f.user_agent, f.headers["x-role"]) == (100, "opencode/1", "main")
    assert f.prompt_tokens > 0
    thinking = facts_of("messages", {"thinking": {"type": "enabled"}, "messages": []}, {}, "m")
    assert thinking.needs == ("reasoning",)


@given(
    tokens=st.integers(min_value=0, max_value=300_000),
    over=st.integers(min_value=0, max_value=300_000),
    credential=st.booleans(),
)
def test_the_first_eligible_candidate_wins_and_every_earlier_one_says_why(tokens, over, credential):
    c = config(routes=[{"name": "long", "when": {"prompt_tokens_over": over}, "upstream": "cloud"}])
    d = decide_for(c, facts(tokens), environ={"CLOUD_API_KEY": "k"} if credential else {})
    goes_long = tokens > over and credential
    assert (d.taken is not None and d.taken.route == "long") == goes_long
    if not goes_long:
        assert d.taken is None or d.taken.route == "default"
        assert (d.taken is None) == (tokens > 131072)
    assert [c.route for c, _ in d.rejected] == (["long"] if tokens > over and not credential else []) + (
        ["default"] if d.taken is None else []
    )


def test_the_breaker_opens_after_n_failures_within_the_window_and_closes_after():
    b = Breaker(failures=3, window_s=10, open_s=30)
    b.failed("gpu0", 0)
    b.failed("gpu0", 11)  # the first is out of the window
    b.failed("gpu0", 12)
    assert b.open(12) == {}
    b.failed("gpu0", 13)
    assert "gpu0" in b.open(14) and b.open(44) == {}
    b.failed("gpu1", 1)
    b.succeeded("gpu1")
    assert "gpu1" not in b.open(2)


# -- tapfix check ---------------------------------------------------------------------------------------
@dataclass
class Status:
    name: str
    ok: bool = True
    served: list[str] = field(default_factory=list)
    windows: dict[str, tuple[int, str]] = field(default_factory=dict)


def test_check_names_the_route_and_the_variable():
    problems = route_problems(config(), {}, [])
    errors = [str(p) for p in problems if p.severity == "error"]
    assert errors == [
        "error: models.coder.routes.long-context: upstream cloud has no credential (CLOUD_API_KEY is not set): "
        "it can never be taken"
    ]


def test_check_finds_a_promotion_to_a_window_no_larger_and_an_unserved_model():
    c = config()
    statuses = [
        Status("cloud", served=["deepseek-v4-flash"], windows={"deepseek-v4-flash": (65536, "GET /v1/models")}),
        Status("local", served=["qwen3.6-8b"]),
    ]
    found = [str(p) for p in route_problems(c, {"CLOUD_API_KEY": "k"}, statuses)]
    assert any("its window 65,536 can't hold a prompt over 100,000 tokens" in p for p in found)
    assert any("models.coder (default route): upstream local does not serve 'qwen3.6-27b'" in p for p in found)
    bigger = [Status("cloud", served=["deepseek-v4-flash"], windows={"deepseek-v4-flash": (120000, "x")})]
    found = [str(p) for p in route_problems(c, {"CLOUD_API_KEY": "k"}, bigger)]
    assert any("a promotion to a window no larger than the default's (120,000 <= 131,072)" in p for p in found)
    fine = [Status("cloud", served=["deepseek-v4-flash"], windows={"deepseek-v4-flash": (1_000_000, "x")})]
    assert [p for p in route_problems(c, {"CLOUD_API_KEY": "k"}, fine) if p.severity == "error"] == []


def test_the_reasoning_dialect_follows_the_route_taken():
    """A dialect the config didn't set is the engine's: a route to an Ollama upstream gets Ollama's levels
    (xhigh mapped to high) while the default vLLM upstream gets xhigh as sent."""
    from tapfix.proxy.request.policy import RequestPolicy

    c = from_dict(
        {
            "upstreams": {
                "local": {"base_url": "http://127.0.0.1:1/v1", "engine": "vllm"},
                "big": {"base_url": "http://127.0.0.1:2/v1", "engine": "ollama"},
            },
            "models": {
                "coder": {
                    "upstream": "local",
                    "routes": [{"name": "long", "when": {"prompt_tokens_over": 50}, "upstream": "big"}],
                }
            },
        }
    )
    policy = RequestPolicy(c, environ={})
    sent = {}
    for content in ("hi", "x" * 1000):
        body = json.dumps(
            {"model": "coder", "reasoning_effort": "xhigh", "messages": [{"role": "user", "content": content}]}
        )
        outcome = policy.apply("/v1/chat/completions", body.encode(), {})
        assert outcome.upstream is not None
        sent[outcome.upstream.name] = json.loads(outcome.body)["reasoning_effort"]
    assert sent == {"local": "xhigh", "big": "high"}


def test_a_glob_name_passing_names_on_is_not_reported_unserved():
    from tapfix.proxy.request.routing import compare_served

    data = json.loads(json.dumps(ISSUE_EXAMPLE))
    data["models"]["qwen*"] = {"upstream": "local"}
    problems = [str(p) for p in compare_served(from_dict(data), "local", ["qwen3.6-27b", "qwen3.6-4b"])]
    assert problems == []
    problems = [str(p) for p in compare_served(from_dict(data), "local", ["qwen3.6-27b"])]
    assert problems == [
        "error: models.claude-haiku-*.upstream_model: upstream local does not serve 'qwen3.6-4b'; it serves: "
        "qwen3.6-27b; did you mean 'qwen3.6-27b'?"
    ]


def test_after_an_overflow_only_a_strictly_larger_window_is_eligible():
    c = config(routes=[{"name": "same", "upstream": "cloud", "context_window": 131072}])
    d = decide_for(c, facts(1000), environ={"CLOUD_API_KEY": "k"}, larger_than=131072)
    assert d.taken is None
    assert [r.message for _, r in d.rejected] == [
        "window 131,072 not larger than the 131,072 the prompt overflowed",
        "window 131,072 not larger than the 131,072 the prompt overflowed",
    ]
    unknown = decide_for(config(routes=[], context_window=None), facts(1000), larger_than=4096)
    assert unknown.taken is None and "its window is unknown" in unknown.rejected[0][1].message
    bigger = decide_for(c, facts(1000), environ={"CLOUD_API_KEY": "k"}, larger_than=100000)
    assert bigger.taken is not None and bigger.taken.route == "same"


def test_a_prompt_orjson_refuses_is_still_sized_and_routed():
    body = json.loads('{"model": "coder", "messages": [{"role": "user", "content": "a \\ud800 b"}], "n": 1}')
    body["seed"] = 2**70
    f = facts_of("chat", body, {}, "coder")
    assert f.prompt_tokens > 0 and f.thread is not None
