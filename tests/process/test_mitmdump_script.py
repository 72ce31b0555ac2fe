"""A stock `mitmdump -s` on a tapfix addon file refuses with a message (addons/runner/script.py).

The decision is documented there and in docs/architecture.md: the addons need the runtime
`tapfix run` builds, so loading one alone must fail loudly, never run as a silent no-op.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tapfix.addons.runner.script import MESSAGE

ROOT = Path(__file__).resolve().parents[2]
MITMDUMP = Path(sys.executable).parent / "mitmdump"
ADDON_FILES = sorted(p for p in (ROOT / "addons").glob("*.py") if p.name != "__init__.py")


def test_every_addon_file_is_covered() -> None:
    assert {p.stem for p in ADDON_FILES} >= {"auth", "health", "recorder", "router", "stream"}


@pytest.mark.parametrize("addon", ADDON_FILES, ids=lambda p: p.stem)
def test_mitmdump_s_refuses_a_tapfix_addon_with_a_message(addon: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            str(MITMDUMP),
            "-q",
            "-s",
            str(addon),
            "--listen-host",
            "127.0.0.1",
            "-p",
            "0",
            "--set",
            f"confdir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert MESSAGE in out.replace("\n", " "), out
    assert "Error logged during startup" in out, out
