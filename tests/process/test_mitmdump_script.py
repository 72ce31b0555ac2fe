"""A stock `mitmdump -s` on a tapfix addon file refuses with a message (addons/runner/script.py).

The decision is documented there and in docs/architecture.md: the addons need the runtime
`tapfix run` builds, so loading one alone must fail loudly, never run as a silent no-op.

Every addon file re-exports the same module-level `load` (tests/unit/addons/test_script_refusal.py checks
each file in-process, loaded the way `-s` loads it); here one stock mitmdump process shows what that
`load` does to it: the message, and exit status 1.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tapfix.addons.runner.script import MESSAGE

ROOT = Path(__file__).resolve().parents[2]
MITMDUMP = Path(sys.executable).parent / "mitmdump"


def test_mitmdump_s_refuses_a_tapfix_addon_with_a_message(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            str(MITMDUMP),
            "-q",
            "-s",
            str(ROOT / "addons" / "recorder.py"),
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
