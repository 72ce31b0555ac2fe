"""`tapfix replay` where only its process shows it: Ctrl-C keeps the finished runs and prints the summary
(exit 130), and the command runs as a module. The rest: tests/inproc/test_replay.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.inproc.test_replay import replays_in, store_source
from tests.support.inproc import start_mock
from tests.support.procs import TAPFIX


def test_ctrl_c_keeps_finished_runs_and_prints_the_summary(tmp_path: Path) -> None:
    stall = tmp_path / "stall.json"
    stall.write_text(json.dumps({"rules": [{"when": {"after": 2}, "do": "stall", "seconds": 60}]}))
    mock = start_mock(tmp_path, "--scenario", str(stall))
    db = tmp_path / "c.db"
    source = store_source(db, mock.url)
    proc = subprocess.Popen(
        [*TAPFIX_REPLAY, source, "--db", str(db), "--times", "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while replays_in(db) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.3)  # the third run is now waiting on the stalled stream
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
        mock.stop()
    assert proc.returncode == 130, err.decode()
    text = out.decode()
    assert "2 runs of 5" in text and "interrupted" in text
    assert replays_in(db) == 2


TAPFIX_REPLAY = [sys.executable, "-m", "tapfix.proxy.cli.replay"]


def test_replay_command_is_registered_or_runnable() -> None:
    """Until `cli.py` registers it, `python -m tapfix.proxy.cli.replay` is the way in."""
    result = subprocess.run([*TAPFIX, "replay", "--help"], capture_output=True, timeout=60)
    if result.returncode != 0:
        result = subprocess.run([*TAPFIX_REPLAY, "--help"], capture_output=True, timeout=60)
    assert result.returncode == 0 and b"--concurrency" in result.stdout
