import json

import orjson
import pytest
from tapfix.proxy.config.file import Config, from_dict
from tapfix.proxy.request.routing import (
    Problem,
    Route,
    RouteError,
    compare_served,
    models_listing,
    preflight_static,
    resolve,
)


def config(**models):
    return from_dict(
        {
            "upstreams": {
                "gpu0": {"base_url": "http://127.0.0.1:8000/v1", "engine": "vllm", "api_key_env": "GPU0_KEY"},
                "gpu1": {"base_url": "http://127.0.0.1:8001/v1", "engine": "llamacpp"},
            },
            "models": models
            or {
                "qwen3-32b": {"upstream": "gpu0", "upstream_model": "Qwen/Qwen3-32B", "aliases": ["qwen"]},
                "glm": {"upstream": "gpu1"},
            },
        }
    )


# (client's model, upstream, served id, rename recorded)
ROUTES = [
    ("qwen3-32b", "gpu0", "Qwen/Qwen3-32B", True),
    ("qwen", "gpu0", "Qwen/Qwen3-32B", True),
    ("glm", "gpu1", "glm", False),
]


@pytest.mark.parametrize(("model", "upstream", "served", "renamed"), ROUTES)
def test_resolve(model, upstream, served, renamed):
    route = resolve(config(), model)
    assert isinstance(route, Route)
    assert (route.model, route.upstream.name, route.served_model) == (model, upstream, served)
    change = route.change()
    assert (change is not None) == renamed
    if change:
        assert (change.stage, change.kind, change.path, change.before, change.after) == (
            "router",
            "rename",
            "$.model",
            model,
            served,
        )


def test_unknown_model_is_a_404_listing_what_is_served():
    error = resolve(config(), "gpt-4o")
    assert isinstance(error, RouteError) and error.status == 404
    assert orjson.loads(error.answer("chat").body) == {
        "error": {
            "message": "model 'gpt-4o' is not served here; served models: qwen3-32b, glm (aliases: qwen → qwen3-32b)",
            "type": "invalid_request_error",
            "code": "model_not_found",
            "param": "model",
        }
    }


def test_names_are_exact():
    assert isinstance(resolve(config(), "Qwen3-32B"), RouteError)
    assert isinstance(resolve(config(), "Qwen/Qwen3-32B"), RouteError)  # served id is not a public name


def test_no_aliases_no_parenthesis():
    error = resolve(config(a={"upstream": "gpu0"}), "b")
    assert orjson.loads(error.answer(None).body)["error"]["message"] == "model 'b' is not served here; served models: a"


@pytest.mark.parametrize(
    ("model", "code"),
    [(None, "missing_model"), (5, "invalid_model"), ("", "invalid_model"), (["a"], "invalid_model")],
)
def test_missing_or_bad_model_is_a_400(model, code):
    error = resolve(config(), model)
    assert isinstance(error, RouteError) and error.status == 400
    body = orjson.loads(error.answer("responses").body)["error"]
    assert body["code"] == code and body["type"] == "invalid_request_error" and "served models" in body["message"]


@pytest.mark.parametrize("model", ["anything", "gpt-4o", None, 5])
def test_quick_mode_passes_every_name_through(model):
    route = resolve(Config.quick("http://127.0.0.1:8000/v1"), model)
    assert isinstance(route, Route) and route.upstream is None and route.change() is None
    assert route.served_model == (model if isinstance(model, str) else None)


def test_models_listing():
    listing = models_listing(config())
    assert listing["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"], m["root"], m.get("parent")) for m in listing["data"]] == [
        ("qwen3-32b", "model", "gpu0", "Qwen/Qwen3-32B", None),
        ("qwen", "model", "gpu0", "Qwen/Qwen3-32B", "qwen3-32b"),
        ("glm", "model", "gpu1", "glm", None),
    ]
    json.dumps(listing)
    assert models_listing(Config.quick("http://x")) == {"object": "list", "data": []}


def test_models_listing_leaves_out_glob_names():
    """A glob public name serves names clients already send; listed, a client offering the listing to its
    user would offer the pattern `claude-haiku-*` as if it were a model."""
    listing = models_listing(
        config(**{"claude-haiku-*": {"upstream": "gpu1", "upstream_model": "small"}, "glm": {"upstream": "gpu1"}})
    )
    assert [m["id"] for m in listing["data"]] == ["glm"]


def test_preflight_static(tmp_path):
    good = tmp_path / "Good"
    good.mkdir()
    (good / "generation_config.json").write_text('{"temperature": 0.6}')
    cfg = config(
        a={"upstream": "gpu0", "generation_config": str(good)},
        b={"upstream": "gpu0", "generation_config": str(tmp_path / "missing")},
        c={"upstream": "gpu0", "sampling": {"top_p": {"mode": "override"}}},
    )
    problems = preflight_static(cfg, {})
    assert Problem("error", "upstreams.gpu0.api_key_env", "environment variable GPU0_KEY is not set") in problems
    assert any(p.where == "models.b.generation_config" and "cannot read" in p.message for p in problems)
    assert not any(p.where.startswith("models.a") for p in problems)
    assert Problem("warning", "upstreams.gpu1", "no model is routed to this upstream") in problems
    assert any(p.where == "models.c.sampling.top_p" and p.severity == "warning" for p in problems)
    fixed = preflight_static(cfg, {"GPU0_KEY": "secret"})
    assert not any(p.where.endswith("api_key_env") for p in fixed)
    assert any("is empty" in p.message for p in preflight_static(cfg, {"GPU0_KEY": ""}))


def test_a_read_timeout_is_said_to_have_no_effect():
    """`[upstreams.X] read_timeout` was accepted and never read: a silent no-op is a warning now."""
    cfg = from_dict(
        {
            "upstreams": {"gpu0": {"base_url": "http://127.0.0.1:8000/v1", "engine": "vllm", "read_timeout": 600}},
            "models": {"m": {"upstream": "gpu0"}},
        }
    )
    found = [p for p in preflight_static(cfg, {}) if p.where == "upstreams.gpu0.read_timeout"]
    assert [p.severity for p in found] == ["warning"] and "no effect" in found[0].message


def test_preflight_quick_mode_checks_the_flag_generation_config(tmp_path):
    problems = preflight_static(Config.quick("http://x", generation_config=tmp_path / "nope"), {})
    assert [p.where for p in problems] == ["--generation-config.generation_config"]


def test_compare_served():
    cfg = config()
    assert compare_served(cfg, "gpu0", ["Qwen/Qwen3-32B", "other"]) == []
    [problem] = compare_served(cfg, "gpu0", ["Qwen/Qwen3-32B-AWQ"])
    assert problem.severity == "error" and problem.where == "models.qwen3-32b.upstream_model"
    assert problem.message == (
        "upstream gpu0 does not serve 'Qwen/Qwen3-32B'; it serves: Qwen/Qwen3-32B-AWQ; "
        "did you mean 'Qwen/Qwen3-32B-AWQ'?"
    )
    assert "it serves: nothing" in compare_served(cfg, "gpu1", [])[0].message
    assert compare_served(cfg, "gpu7", [])[0].message == "no such upstream in the config"
