"""The repository's folders install under one `tapfix` namespace, data files included."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
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


@pytest.mark.e2e
def test_wheel_installs_under_tapfix_with_schemas(tmp_path):
    """A non-editable install carries the schemas and puts nothing named `proxy` at the top."""
    import subprocess
    import sys
    import zipfile

    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("tapfix-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops <= {"tapfix", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, tops
    assert "tapfix/schemas/config.schema.json" in names
    assert "tapfix/proxy/cli/main.py" in names and "tapfix/addons/recorder.py" in names


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
