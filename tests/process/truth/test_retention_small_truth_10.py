"""Issue 15 item 10: `run --strict` in quick mode refuses an unreachable upstream at start, as with --config
(the process's exit code and message). The other small ones: tests/inproc/truth/test_retention_small_truth_10.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.config_text import toml_table
from tests.support.inproc import start_proxy
from tests.support.procs import TAPFIX, free_port


def test_truth_10_strict_refuses_unreachable_upstream_in_quick_mode(tmp_path: Path) -> None:
    """`--strict` means what it means with --config: the preflight runs, an unreachable upstream stops the start."""
    dead = f"http://127.0.0.1:{free_port()}"
    config = tmp_path / "tapfix.toml"
    config.write_text(
        toml_table("upstreams.local", base_url=f"{dead}/v1", engine="vllm")
        + toml_table("models.m", upstream="local", upstream_model="m")
    )
    for mode in (("--config", str(config)), ("--upstream", dead)):
        port = free_port()
        args = [*TAPFIX, "run", *mode, "--strict", "--listen", f"127.0.0.1:{port}", "--db", str(tmp_path / "c.db")]
        try:
            result = subprocess.run(args, capture_output=True, timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"tapfix run {' '.join(mode)} --strict started against an unreachable upstream")
        err = result.stderr.decode()
        assert result.returncode == 1, (mode, err)
        assert "--strict" in err and "unreachable" in err and dead in err, (mode, err)

    # Without --strict, quick mode still starts (and says nothing is wrong until a request fails).
    started = start_proxy(tmp_path, dead, db=tmp_path / "d.db")  # in-process: the start is what is checked
    started.stop()
