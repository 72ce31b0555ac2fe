"""The shell command the scripted model gives Codex CLI to create a file, run by a real `sh`: it writes exactly
the content asked for (quotes, `%`, a leading dash, escapes). The rest of the scripted model's Codex tools:
tests/unit/test_mock_codex.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from tapfix.proxy.mock.prompt_intent import create_command


@pytest.mark.parametrize(
    ("filename", "content"),
    [
        ("hello.txt", "Hello, world!\n"),
        ("notes/it's.md", "it's 100% done\\n, not 50%\n\nbye"),
        ("dash.txt", "-n starts with a dash\n"),
    ],
)
def test_the_creating_command_writes_exactly_the_content(tmp_path: Path, filename: str, content: str) -> None:
    subprocess.run(["sh", "-c", create_command(filename, content)], cwd=tmp_path, check=True)
    assert (tmp_path / filename).read_text() == content
