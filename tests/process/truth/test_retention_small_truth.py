"""Issue 15 item 9, the start-up half: `tapfix run` (flags, or the config file's [retention]) refuses a size
under the empty store's floor and an age under a minute before it starts, naming them (exit code, stderr).
The store, its floor and `captures purge`: tests/inproc/truth/test_retention_small_truth.py, which also runs
`run`'s refusal of every age under a minute in the test process (CliRunner); one age is refused here by a
real process.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.inproc.truth.test_retention_small_truth import _copy, _floor, filled  # noqa: F401 - a fixture
from tests.inproc.truth.test_retention_small_truth import retention_config as _retention_config
from tests.support.procs import TAPFIX, free_port


def _run_refused(*args: str) -> tuple[int, str]:
    """`tapfix run ...` that must exit before serving; one that serves is killed and fails the test."""
    try:
        result = subprocess.run([*TAPFIX, "run", *args], capture_output=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"tapfix run {' '.join(args)} started instead of refusing")
    return result.returncode, result.stderr.decode()


def test_truth_9_size_below_floor_refused(filled: Path, tmp_path: Path) -> None:  # noqa: F811
    """`run` and the config file's [retention] refuse a size the empty store alone exceeds, naming the floor."""
    floor = _floor(_copy(filled, tmp_path / "c.db"), tmp_path)
    port = free_port()
    listen = ("--listen", f"127.0.0.1:{port}")
    code, err = _run_refused(
        "--upstream", "http://127.0.0.1:9", *listen, "--db", str(tmp_path / "n.db"), "--max-size", "50K"
    )
    assert code != 0 and f"{floor} bytes" in err, err
    config = _retention_config(tmp_path, port, 'max_size = "50K"')
    code, err = _run_refused("--config", str(config), "--db", str(tmp_path / "n2.db"))
    assert code != 0 and f"{floor} bytes" in err, err


@pytest.mark.parametrize("age", ["0.5m"])  # every age under a minute: the in-process tier's
def test_truth_9_min_age_refused(tmp_path: Path, age: str) -> None:
    """An age under a minute would purge each capture right after it is written: refused, naming 1 minute."""
    port = free_port()
    listen = ("--listen", f"127.0.0.1:{port}")
    code, err = _run_refused(
        "--upstream", "http://127.0.0.1:9", *listen, "--db", str(tmp_path / "n.db"), "--max-age", age
    )
    assert code == 2 and "--max-age" in err and "1 minute" in err, err
    config = _retention_config(tmp_path, port, f'max_age = "{age}"')
    code, err = _run_refused("--config", str(config), "--db", str(tmp_path / "n2.db"))
    assert code != 0 and "max_age" in err and "1 minute" in err, err
