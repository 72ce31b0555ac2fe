"""The reference pages are the commands and the config schema, rendered: what the docs say tapfix takes is
what it takes (docs/reference/cli.md from click, the config keys in docs/reference/config.md from
schemas/config.schema.json)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
from tapfix.proxy.cli.main import main as tapfix
from tapfix.proxy.cli.reference import render
from tapfix.proxy.config import reference as config_reference

ROOT = Path(__file__).resolve().parents[2]
CLI_PAGE = ROOT / "docs" / "reference" / "cli.md"
CONFIG_PAGE = ROOT / "docs" / "reference" / "config.md"


def test_the_cli_page_is_the_commands_rendered() -> None:
    assert CLI_PAGE.read_text(encoding="utf-8") == render(), (
        "docs/reference/cli.md differs from the commands: run "
        ".venv/bin/python -m tapfix.proxy.cli.reference docs/reference/cli.md"
    )


def _commands(group: click.Group, ctx: click.Context) -> list[tuple[str, click.Command, click.Context]]:
    found = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        sub = click.Context(command, info_name=name, parent=ctx)
        found.append((sub.command_path, command, sub))
        if isinstance(command, click.Group):
            found.extend(_commands(command, sub))
    return found


def test_every_command_and_visible_option_has_its_place_on_the_page() -> None:
    page = render()
    root = click.Context(tapfix, info_name="tapfix", **tapfix.context_settings)
    commands = _commands(tapfix, root)
    assert {"tapfix run", "tapfix captures list", "tapfix probe"} <= {path for path, _, _ in commands}
    for path, command, ctx in commands:
        section = page.split(f"\n## {path}\n", 1)[1].split("\n## ", 1)[0]
        names = re.findall(r"^\| `([^`]+)` \|", section, flags=re.M)  # the option column of its table
        for param in command.get_params(ctx):
            if isinstance(param, click.Option) and not param.hidden and param is not command.get_help_option(ctx):
                words = [set(re.split(r"[ ,/]+", cell)) for cell in names]
                assert any(set(param.opts) <= w for w in words), (path, param.opts)


def test_help_text_is_escaped_not_read_as_markup() -> None:
    @click.command()
    @click.option("--pattern", help="a glob such as prefix* or <ID>, `kept * as <code>` | piped")
    def cmd(pattern: str) -> None:
        """First line.

        \b
        Example:
          tapfix cmd --pattern 'a*'
        """

    page = render(cmd)
    assert "prefix\\* or &lt;ID>, `kept * as <code>` \\| piped" in page
    assert "Example:\n\n```sh\ntapfix cmd --pattern 'a*'\n```" in page


def test_the_config_page_lists_every_key_of_the_schema() -> None:
    text = CONFIG_PAGE.read_text(encoding="utf-8")
    assert config_reference.replace_block(text) == text, (
        "docs/reference/config.md differs from schemas/config.schema.json: run "
        ".venv/bin/python -m tapfix.proxy.config.reference docs/reference/config.md"
    )
    schema = json.loads((ROOT / "schemas" / "config.schema.json").read_text(encoding="utf-8"))
    table = config_reference.render_table(schema)
    keys = set(re.findall(r"^\| `([^`]+)` \|", table, flags=re.M))
    assert set(schema["properties"]) <= keys
    for name in schema["$defs"]["upstream"]["properties"]:
        assert f"upstreams.NAME.{name}" in keys, name
    for name in schema["$defs"]["model"]["properties"]:
        assert f"models.NAME.{name}" in keys, name
    assert "models.NAME.reasoning.budgets.LEVEL" in keys


def test_a_stale_config_table_is_rewritten_between_its_markers_only(tmp_path: Path) -> None:
    page = tmp_path / "config.md"
    begin, end = config_reference.BEGIN, config_reference.END
    page.write_text(f"# x\n\nbefore\n\n{begin}\n| old | table |\n{end}\n\nafter\n", encoding="utf-8")
    assert config_reference.main(["reference", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    assert text.startswith("# x\n\nbefore\n\n") and text.endswith("\n\nafter\n")
    assert config_reference.render_table() in text and "| old | table |" not in text
