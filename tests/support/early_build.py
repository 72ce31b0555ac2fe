"""The llama-server build (scripts/build-llama-server) starts with the run, in the background, so a cold
machine builds it while the rest of the suite runs; the real-engine tests run last and by then find it
(the script holds a lock: their fixture's own call waits for this one, then prints the cached build).

Started by the process that runs the session (xdist's controller, or plain pytest), only when the run
covers tests/realengine/, niced so the tests keep the cores they need; stopped at the end if no
real-engine test waited for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from tests.process.realengine.engine import BUILD_SCRIPT, ROOT, cache_root

REALENGINE = ROOT / "tests" / "process" / "realengine"


def covers_realengine(config: pytest.Config) -> bool:
    markexpr = config.option.markexpr or ""
    # A real-engine test carries these markers (its tier's is set from its folder): would -m keep it?
    if markexpr and not Expression.compile(markexpr).evaluate(lambda name: name in ("realengine", "process", "e2e")):
        return False
    for arg in config.args:
        path = Path(str(arg).split("::", 1)[0])
        path = (path if path.is_absolute() else Path(config.invocation_params.dir) / path).resolve()
        if path == REALENGINE or path in REALENGINE.parents or REALENGINE in path.parents:
            return True
    return False


def start(config: pytest.Config) -> subprocess.Popen | None:
    if hasattr(config, "workerinput") or not covers_realengine(config) or os.environ.get("TAPFIX_LLAMA_SERVER"):
        return None
    log = cache_root() / "early-build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        return subprocess.Popen(
            ["nice", "-n", "10", str(BUILD_SCRIPT)], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop(proc: subprocess.Popen | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)  # its own process group: the script, cmake and the compilers
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
