"""The slow installs of the real-engine suites start with the run, in the background, so a cold machine
builds them while the rest of the suite runs: llama.cpp's llama-server (scripts/build-llama-server, for
tests/process/realengine/) and vLLM's CPU build (scripts/install-vllm, for tests/process/vllm/). Each
script holds a lock: a fixture's own call waits for the running one, then prints the cached result.
`order` says when each suite's tests run.

Started by the process that runs the session (xdist's controller, or plain pytest), only for the suites the
run covers and doesn't deselect by marker, niced so the tests keep the cores they need; stopped at the end
if no test waited for them.
"""

from __future__ import annotations

import os
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from tests.process.realengine.engine import BUILD_SCRIPT, ROOT, cache_root
from tests.process.vllm.engine import INSTALL_SCRIPT


@dataclass(frozen=True)
class Suite:
    directory: Path
    marker: str
    script: Path
    override: str  # the environment variable that names an existing engine instead


REALENGINE = ROOT / "tests" / "process" / "realengine"
VLLM = ROOT / "tests" / "process" / "vllm"
SUITES = (
    Suite(REALENGINE, "realengine", BUILD_SCRIPT, "TAPFIX_LLAMA_SERVER"),
    Suite(VLLM, "vllm", INSTALL_SCRIPT, "TAPFIX_VLLM"),
)


def covers(config: pytest.Config, suite: Suite) -> bool:
    markexpr = config.option.markexpr or ""
    # A suite's test carries these markers (its tier's is set from its folder): would -m keep it?
    keeps = (suite.marker, "process", "e2e")
    if markexpr and not Expression.compile(markexpr).evaluate(lambda name: name in keeps):
        return False
    for arg in config.args:
        path = Path(str(arg).split("::", 1)[0])
        path = (path if path.is_absolute() else Path(config.invocation_params.dir) / path).resolve()
        if path == suite.directory or path in suite.directory.parents or suite.directory in path.parents:
            return True
    return False


def start(config: pytest.Config) -> list[subprocess.Popen]:
    if hasattr(config, "workerinput"):
        return []
    started = []
    for suite in SUITES:
        if not covers(config, suite) or os.environ.get(suite.override):
            continue
        log = cache_root() / f"early-{suite.script.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            started.append(
                subprocess.Popen(
                    ["nice", "-n", "10", str(suite.script)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    return started


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is not None:
            continue
        os.killpg(proc.pid, signal.SIGTERM)  # its own process group: the script and what it runs
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def order(path: Path) -> int:
    """Where a test file runs: the vLLM suite first (its install, 3 to 8 minutes cold, is started before the
    suite by .ci/run and is well on its way by then; its servers and tests then run beside the rest of the
    suite on the other worker instead of after it), the llama.cpp suite last (its cold build takes 15 minutes).
    """
    if VLLM in path.parents:
        return 0
    return 2 if REALENGINE in path.parents else 1


def done(procs: list[subprocess.Popen]) -> bool:
    """Every early build this run started has finished (a warm cache: the scripts print the cached path at once)."""
    return all(proc.poll() is not None for proc in procs)


def tier_rank(scope: str) -> int:
    """Which files a worker takes first once the builds are done (the slowest per file first, so the run ends
    on small ones): the process and agent tiers, then the in-process tier, then the rest (unit tests)."""
    if scope.startswith(("tests/process/", "tests/e2e/")):
        return 0
    return 1 if scope.startswith("tests/inproc/") else 2
