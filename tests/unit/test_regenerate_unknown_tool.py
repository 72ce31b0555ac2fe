"""Issue 19's `regenerate_unknown_tool` and per-model `[models.X] regenerate`: a call naming a tool the
request didn't offer is regenerated only when asked for (otherwise it passes as sent, flagged), and a
model's own settings win over the global ones for that model."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from tapfix.proxy.cli import main
from tapfix.proxy.config.file import ConfigError, load
from tapfix.proxy.regenerate.eligibility import RegenerateSettings
from tapfix.proxy.regenerate.splice import AttemptSplice

from tests.support.builders import chat_chunk, sse, tool, tool_call_chunk
from tests.support.flows import runtime
from tests.support.stage_io import client_view
from tests.unit.test_regenerate_splice import regenerated

TOOLS = [tool("read", {"path": {"type": "string"}}, ["path"])]


def calling(name: str, id: str) -> bytes:
    return sse(
        [
            chat_chunk({"role": "assistant", "content": ""}, id=id),
            tool_call_chunk(0, f"c-{id}", name, '{"path": "a.txt"}', chunk_id=id),
            chat_chunk({}, "tool_calls", id=id),
            {**chat_chunk(id=id), "choices": [], "usage": {"total_tokens": 9}},
        ]
    )


def run(attempts: list[bytes], settings: RegenerateSettings, seed: int = 0) -> tuple[bytes, AttemptSplice]:
    data, _, splice = regenerated(attempts, settings=settings, seed=seed)
    return data, splice


@pytest.mark.parametrize("seed", range(20))
def test_an_unknown_tool_is_regenerated_when_asked(seed: int) -> None:
    data, splice = run(
        [calling("delete_everything", "first"), calling("read", "second")],
        RegenerateSettings(1, unknown_tool=True),
        seed,
    )
    view = client_view(data)
    assert [c["name"] for c in view.calls] == ["read"] and view.errors == [] and view.done == 1
    assert [(d.made, d.changes[0].before) for d in splice.decisions] == [(True, "unknown_tool")]


def test_without_the_setting_an_unknown_tool_passes_as_sent() -> None:
    data, splice = run([calling("delete_everything", "first")], RegenerateSettings(1))
    view = client_view(data)
    assert [c["name"] for c in view.calls] == ["delete_everything"] and view.done == 1
    assert splice.decisions == [] and any(c.get("usage") for c in view.chunks)


@pytest.mark.parametrize("seed", range(10))
def test_when_every_attempt_names_an_unknown_tool_the_last_passes_as_sent(seed: int) -> None:
    attempts = [calling("delete_everything", "first"), calling("rm_rf", "second")]
    data, splice = run(attempts, RegenerateSettings(1, unknown_tool=True), seed)
    view = client_view(data)
    assert [c["name"] for c in view.calls] == ["rm_rf"] and view.errors == [] and view.done == 1
    assert [(d.made, d.reason) for d in splice.decisions] == [(True, "fresh_seed"), (False, "attempts_spent")]


CONFIG = {
    "regenerate": 2,
    "upstreams": {"gpu0": {"base_url": "http://127.0.0.1:9/v1", "engine": "vllm"}},
    "models": {
        "qwen": {"regenerate": 0, "aliases": ["q"]},
        "glm": {"regenerate_unknown_tool": True},
        "plain": {},
    },
}


def test_a_models_own_settings_win_for_that_model() -> None:
    rt = runtime(config=CONFIG, regenerate=2)
    assert (rt.regenerate_settings("qwen").attempts, rt.regenerate_settings("q").attempts) == (0, 0)
    assert rt.regenerate_settings("glm") == RegenerateSettings(2, 60.0, True)
    assert rt.regenerate_settings("plain") == RegenerateSettings(2, 60.0, False)
    assert rt.regenerate_settings("not-served").attempts == 2


def test_the_global_unknown_tool_setting_reaches_every_model_without_its_own() -> None:
    rt = runtime(config=CONFIG, regenerate=1, regenerate_unknown_tool=True)
    assert rt.regenerate_settings("plain").unknown_tool and rt.regenerate_settings("glm").unknown_tool


def config_file(tmp_path: Path, model: str, top: str = "") -> Path:
    file = tmp_path / "tapfix.toml"
    file.write_text(
        f'{top}\n[upstreams.gpu0]\nbase_url = "http://127.0.0.1:8000/v1"\nengine = "vllm"\n\n[models.qwen]\n{model}\n'
    )
    return file


def test_config_keys_per_model_are_read_and_range_checked(tmp_path: Path) -> None:
    c = load(config_file(tmp_path, "regenerate = 3\nregenerate_unknown_tool = true", "regenerate_unknown_tool = false"))
    assert (c.models["qwen"].regenerate, c.models["qwen"].regenerate_unknown_tool) == (3, True)
    assert c.run_settings["regenerate_unknown_tool"] is False
    with pytest.raises(ConfigError, match=r"models\.qwen\.regenerate"):
        load(config_file(tmp_path, "regenerate = 11"))
    with pytest.raises(ConfigError, match="regenerate_unknown_tool"):
        load(config_file(tmp_path, 'regenerate_unknown_tool = "yes"'))


def test_the_flag_is_in_the_help() -> None:
    result = CliRunner().invoke(main, ["run", "--help"])
    assert "--regenerate-unknown-tool" in result.output
