"""How a config's problems are reported (issue 31 item 22): a UTF-8 BOM is no problem, NaN and infinity
are refused wherever a number has a range, and the schema's errors and the semantic ones come at once."""

from __future__ import annotations

import codecs
from pathlib import Path

import pytest
from tapfix.proxy.config.file import ConfigError, load

MINIMAL = """
[upstreams.gpu0]
base_url = "http://127.0.0.1:8000/v1"
engine = "vllm"

[models.qwen]
"""


def _write(tmp_path: Path, text: str | bytes) -> Path:
    file = tmp_path / "tapfix.toml"
    file.write_bytes(text if isinstance(text, bytes) else text.encode())
    return file


def _problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        load(_write(tmp_path, text))
    return raised.value.problems


def test_a_utf8_bom_is_accepted(tmp_path: Path) -> None:
    """Windows editors write one; the file is the same config with or without it."""
    config = load(_write(tmp_path, codecs.BOM_UTF8 + MINIMAL.encode()))
    assert list(config.models) == ["qwen"] and config.upstreams["gpu0"].engine == "vllm"


@pytest.mark.parametrize(
    ("setting", "where"),
    [
        ("shutdown_grace = nan", "shutdown_grace"),
        ("shutdown_grace = inf", "shutdown_grace"),
        ("regenerate_budget = nan", "regenerate_budget"),
        ("[models.qwen.sampling]\ntemperature = nan", "models.qwen.sampling.temperature"),
        ('[models.qwen.sampling.top_p]\nmode = "clamp"\nmin = -inf\nmax = 0.9', "models.qwen.sampling.top_p.min"),
        ('[models.qwen.sampling.top_p]\nmode = "clamp"\nmin = 0.1\nmax = +inf', "models.qwen.sampling.top_p.max"),
    ],
)
def test_nan_and_infinity_are_refused(tmp_path: Path, setting: str, where: str) -> None:
    text = setting + "\n" + MINIMAL if not setting.startswith("[") else MINIMAL + setting + "\n"
    problems = _problems(tmp_path, text)
    assert any(f"{where}: " in p and "finite" in p for p in problems), problems


def test_upstream_timeouts_must_be_finite(tmp_path: Path) -> None:
    text = MINIMAL.replace('engine = "vllm"', 'engine = "vllm"\nconnect_timeout = inf\nread_timeout = nan')
    problems = _problems(tmp_path, text)
    assert any("upstreams.gpu0.connect_timeout: " in p and "finite" in p for p in problems), problems
    assert any("upstreams.gpu0.read_timeout: " in p and "finite" in p for p in problems), problems


def test_schema_and_semantic_errors_are_reported_together(tmp_path: Path) -> None:
    text = """
mode = "sideways"

[upstreams.gpu0]
base_url = "http://127.0.0.1:8000/v1"
engine = "vllm"

[models.qwen]
upstream = "gpu9"

[models.glm]
upstream = "gpu0"
aliases = ["glm"]
tool_format = "no-such-format"
"""
    problems = _problems(tmp_path, text)
    text_of = "\n".join(problems)
    assert "mode: found 'sideways'" in text_of  # the schema's
    assert "models.qwen.upstream: found 'gpu9'" in text_of  # a reference the schema can't check
    assert "models.glm.aliases: found 'glm'" in text_of  # an alias clash
    assert "models.glm.tool_format: found 'no-such-format'" in text_of
    assert len(problems) == 4, problems


def test_semantic_checks_skip_what_the_schema_already_refused(tmp_path: Path) -> None:
    """A model the schema refused (not a table) or an upstream missing its engine is reported once, by the
    schema, and the other parts are still checked."""
    text = """
[upstreams.gpu0]
base_url = "http://127.0.0.1:8000/v1"

[upstreams.gpu1]
base_url = "http://127.0.0.1:8001/v1"
engine = "vllm"

[models]
broken = 5

[models.qwen]
upstream = "gpu0"
regenerate = 99
"""
    problems = _problems(tmp_path, text)
    text_of = "\n".join(problems)
    assert "upstreams.gpu0.engine: missing" in text_of and "models.broken: found 5" in text_of
    assert "models.qwen.regenerate" in text_of, problems
