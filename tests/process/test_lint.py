"""ruff is part of the test suite, so CI keeps the code clean: its linter (E, F, I, B, UP; see pyproject)
and its formatter (`ruff format` leaves every file as it is)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TREES = ["proxy", "addons", "tests", "bench"]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is in the test extra: scripts/bootstrap installs it"
    return subprocess.run([ruff, *args, *TREES], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_ruff_is_clean():
    result = _ruff("check")
    if result.returncode != 0:
        pytest.fail(result.stdout[-4000:], pytrace=False)


def test_ruff_format_leaves_the_code_as_it_is():
    result = _ruff("format", "--check", "--output-format", "concise")
    if result.returncode != 0:
        pytest.fail(f"run `.venv/bin/ruff format {' '.join(TREES)}`:\n{result.stdout[-4000:]}", pytrace=False)
