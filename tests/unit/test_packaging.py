"""The repository's folders install under one `tapfix` namespace, data files included."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAPPING = {"proxy": "tapfix.proxy", "addons": "tapfix.addons", "schemas": "tapfix.schemas"}


def test_every_subpackage_is_listed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    for folder, package in MAPPING.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            relative = init.parent.relative_to(ROOT / folder).parts
            assert ".".join((package, *relative)) in listed, init


def test_the_core_keeps_few_top_level_modules():
    """`proxy/` is grouped by concern (docs/architecture.md): only shared modules stay at the top."""
    top = sorted(p.stem for p in (ROOT / "proxy").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 12, top
    subpackages = {p.parent.name for p in (ROOT / "proxy").glob("*/__init__.py")}
    assert subpackages >= {"config", "request", "assemble", "response", "toolcalls", "store", "replay", "cli"}


def test_every_command_is_documented():
    from click.testing import CliRunner
    from tapfix.proxy.cli import main

    def walk(group, prefix=()):
        for name in group.list_commands(None):
            command = group.get_command(None, name)
            yield (*prefix, name), command
            if hasattr(command, "commands"):
                yield from walk(command, (*prefix, name))

    for path, command in walk(main):
        assert command.help and command.help.strip(), path
        result = CliRunner().invoke(main, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
