"""ruff (E, F, I, B, UP; see pyproject) is part of the test suite, so CI keeps the code clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_is_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is in the test extra: scripts/bootstrap installs it"
    result = subprocess.run([ruff, "check", "proxy", "addons", "tests", "bench"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:]
