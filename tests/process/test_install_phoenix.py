"""scripts/install-phoenix: two runs on one cache never install over each other.

A second run (another clone, or the suite beside a manual run) used to `rm -rf` the venv a first run
was still pip-installing into. Now it waits on the cache's lock, then finds the first run's install.
The first run is played by this test: it holds the lock and leaves a half-made venv, then completes it.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "install-phoenix"


def _version() -> str:
    for line in SCRIPT.read_text().splitlines():
        if line.startswith("VERSION="):
            return line.split("=", 1)[1].strip('"')
    raise AssertionError("no VERSION= in scripts/install-phoenix")


def test_a_second_run_waits_for_the_first_and_reuses_its_install(tmp_path: Path) -> None:
    root = tmp_path / "cache" / "phoenix"
    venv = root / _version()
    (venv / "bin").mkdir(parents=True)
    half_made = venv / "lib-being-installed"  # what the first run's pip is writing right now
    half_made.write_text("in progress")
    root.joinpath(".lock").touch()
    env = {k: v for k, v in os.environ.items() if k != "TAPFIX_PHOENIX"} | {"TAPFIX_CACHE": str(tmp_path / "cache")}

    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first run is installing
        second = subprocess.Popen(
            [str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and second.poll() is None:
                assert half_made.exists(), "the second run removed the venv the first one is installing into"
                time.sleep(0.05)
            assert second.poll() is None, f"the second run did not wait: {second.communicate()}"
            # The first run finishes its install, then lets go of the lock.
            phoenix = venv / "bin" / "phoenix"
            phoenix.write_text("#!/bin/sh\nexit 0\n")
            phoenix.chmod(0o755)
            (venv / ".installed").touch()
        except BaseException:
            os.killpg(second.pid, signal.SIGKILL)  # the script and whatever it started (venv, pip)
            second.wait(5)
            raise
    out, err = second.communicate(timeout=30)
    assert second.returncode == 0, err
    assert out.strip() == str(venv / "bin" / "phoenix")
    assert "waiting" in err
    assert half_made.exists()  # reused, not reinstalled
