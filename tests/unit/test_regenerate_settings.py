"""Issue 19's settings: `tapfix run --regenerate N` / `--regenerate-budget SECONDS` and their config keys,
range-checked as proxy/config/settings.py declares them (a bad flag is exit 2, a bad config key names the
file)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from tapfix.proxy.cli import main
from tapfix.proxy.config.file import ConfigError, load
from tapfix.proxy.config.settings import Settings

MINIMAL = """
{top}
[upstreams.gpu0]
base_url = "http://127.0.0.1:8000/v1"
engine = "vllm"
{upstream}

[models.qwen]
"""


def config(tmp_path: Path, top: str = "", upstream: str = "") -> Path:
    file = tmp_path / "tapfix.toml"
    file.write_text(MINIMAL.format(top=top, upstream=upstream))
    return file


@pytest.mark.parametrize(
    "args",
    [["--regenerate", "-1"], ["--regenerate", "11"], ["--regenerate-budget", "0"], ["--regenerate-budget", "nan"]],
)
def test_a_bad_regenerate_flag_is_a_usage_error(args: list[str]) -> None:
    result = CliRunner().invoke(main, ["run", "--upstream", "http://127.0.0.1:9", *args])
    assert result.exit_code == 2, result.output
    assert f"'{args[0]}'" in result.stderr and "Traceback" not in result.output


def test_one_extra_attempt_is_the_default() -> None:
    settings = Settings()  # what `tapfix run --upstream URL` gets without these flags
    assert (settings.regenerate, settings.regenerate_budget, settings.regenerate_unknown_tool) == (1, 60.0, False)


def test_the_help_names_the_settings_and_the_default() -> None:
    result = CliRunner().invoke(main, ["run", "--help"])
    assert "--regenerate N" in result.output and "--regenerate-budget" in result.output
    assert "[default: 1; 0<=x<=10]" in " ".join(result.output.split()), result.output


def test_config_keys_are_read_and_range_checked(tmp_path: Path) -> None:
    c = load(config(tmp_path, "regenerate = 2\nregenerate_budget = 30", "regenerate_concurrency = 4"))
    assert (c.run_settings["regenerate"], c.run_settings["regenerate_budget"]) == (2, 30)
    assert (c.upstreams["gpu0"].regenerate_concurrency, c.upstreams["gpu0"].regenerate_per_minute) == (4, None)
    with pytest.raises(ConfigError, match="regenerate"):
        load(config(tmp_path, "regenerate = 99"))
    with pytest.raises(ConfigError, match="regenerate_per_minute"):
        load(config(tmp_path, upstream="regenerate_per_minute = 0"))
