"""The benchmark scripts still reach what they measure: a module move must break them loudly.

`bench/` is not imported by the suite, so a rename in `proxy/` could leave a script timing a
fallback (or nothing) without any test noticing. Every `tapfix.*` name a script imports, at the
top or inside a function, and every `tapfix.*` module it runs with `python -m`, must resolve.

And the rows that price the regeneration relay (issue 19) measure what they say: the `--regenerate 1`
rows with `tools` reach the upstream through the relay and their `--regenerate 0` twins don't, and the
ratio line and `bench/run --baseline` compare like for like.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
MODULE_NAME = re.compile(r"^tapfix\.(proxy|addons)(\.\w+)*$")


# -- the relay's cost (issue 19): the bench's --regenerate 1 rows against --regenerate 0 twins ----------


def _bench(name: str) -> Any:
    """A bench script as a module (they import their siblings by bare name, so bench/ goes on the path)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


FLAG_COMMIT = "5daa0b8"  # settings: tapfix run --regenerate N; its parent rejects the flag


def test_versus_reads_from_each_trees_cli_whether_it_knows_regenerate(tmp_path: Path) -> None:
    versus = _bench("versus")
    assert versus.knows_regenerate(None)  # this tree
    for rev, knows in ((f"{FLAG_COMMIT}^", False), (FLAG_COMMIT, True)):
        if subprocess.run(["git", "-C", str(BENCH.parent), "cat-file", "-e", rev], capture_output=True).returncode:
            pytest.skip(f"{rev} is not in this clone")
        pkg = tmp_path / rev / "tapfix"
        pkg.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "-C", str(BENCH.parent), "archive", rev, "proxy", "addons", "schemas"],
            capture_output=True,
            check=True,
        )
        subprocess.run(["tar", "-x", "-C", str(pkg)], input=archive.stdout, check=True)
        assert versus.knows_regenerate(pkg.parent) is knows, rev


def test_the_regenerate_1_rows_reach_the_upstream_through_the_relay_and_the_twins_do_not(tmp_path: Path) -> None:
    runner = _bench("runner")
    fleet = runner.Fleet(tmp_path, ["--regenerate", "1", "--engine", "vllm"])
    rows = {r.name: r for r in runner.ROWS}
    sent = {runner.ARMED: 3, runner.CALLS0: 2, runner.ARMED0: 1, runner.ROWS[2].name: 2}  # no tools: direct too
    try:
        fleet.start(which=("tapfix", "tapfix0"))
        for name, n in sent.items():
            row = rows[name]
            phase = runner.Phase("check", 2, 16, 0, 0, 0)
            res = asyncio.run(runner.run_block(fleet, row, phase, n, load_body(row.tools)))
            assert not res.errors and len(res.ttft) == n, (name, res.errors)
        assert (fleet.relayed("tapfix"), fleet.relayed("tapfix0")) == (3, 0)
        assert runner.relay_check(fleet).startswith("OK  "), runner.relay_check(fleet)
        fleet.sent[runner.CALLS0] += 1  # the twins' requests are not expected at the relay
        assert runner.relay_check(fleet).startswith("OK  ")
        fleet.sent[runner.CALLS] = 1  # one relayed request the upstream never saw is reported
        assert runner.relay_check(fleet).startswith("WARN"), runner.relay_check(fleet)
    finally:
        fleet.stop()


def load_body(tools: bool) -> bytes:
    return bytes(_bench("load").request_body(2048, tools=tools))
