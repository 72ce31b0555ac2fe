#!/usr/bin/env -S sh -c 'exec "$(dirname "$0")/../.venv/bin/python" "$0" "$@"'
"""CPU per event of the stream callable alone, in-process: the pipeline `StreamOwner` builds for an agent's
request (opencode's tools from bench/agent_tools.json, the splice armed as on the agents' path), fed
bench/upstream.py's 256-event content stream one event per read and several, measured with
`time.thread_time()` (the machine's other load doesn't count). Rows: the tool-call stage armed; a stage that
hands every event back (the pipeline and the SSE split alone); no stage (capture only).

    bench/stream_cpu.py                        # this checkout
    bench/stream_cpu.py --against b3b89c3      # A/B: that commit and this checkout, rounds alternating

`--against` exports the commit (`git archive`) to a temporary folder and runs the same measurement on it in a
child process, so both sides run in one session under the same load. mitmproxy's own machinery around the
callable is not in these numbers: `bench/profile.py` measures the whole process.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CASES = (("tools", 1), ("tools", 4), ("untouched", 1), ("untouched", 4), ("untouched", 16), ("none", 1))


class Untouched:
    """A stage that hands every event back as it got it."""

    def feed(self, event: bytes) -> list[bytes]:
        return [event]

    def flush(self) -> list[bytes]:
        return []


def measure(root: Path, runs: int) -> dict[str, float]:
    """µs per event for each case, from the code under `root` (this checkout or an exported commit)."""
    sys.path[:0] = [str(root / "bench"), str(root)]
    import orjson
    import upstream
    from mitmproxy import http
    from mitmproxy.test import taddons
    from tapfix.addons import default_addons
    from tapfix.addons.stream import StreamOwner

    from tests.support.flows import flow, recorded, runtime

    tools = orjson.loads((root / "bench/agent_tools.json").read_bytes())
    events = list(upstream.sse_events("content", 256))
    rt = runtime(regenerate=1)
    default_addons(rt)  # arms the regeneration (the splice) as `tapfix run` does
    owner = StreamOwner(rt)
    out: dict[str, float] = {}
    with taddons.context(owner):
        for kind, per in CASES:
            reads = [b"".join(events[i : i + per]) for i in range(0, len(events), per)]
            spent = 0.0
            gc.collect()
            for _ in range(runs):
                f = flow(response=http.Response.make(200, b"", {"content-type": "text/event-stream"}))
                ex = recorded(f, tools=None if kind == "none" else tools, stream=True)
                ex.extra["target"] = next(iter(rt.targets))
                owner.responseheaders(f)
                assert f.response is not None
                stream: Any = f.response.stream
                if kind == "untouched":
                    stream.stages = [Untouched()]
                t0 = time.thread_time()
                for read in reads:
                    stream(read)
                spent += time.thread_time() - t0
                stream(b"")
                owner.collect(ex)
            out[f"{kind}, {per} per read"] = spent / runs / len(events) * 1e6
    return out


def export(rev: str, into: Path) -> Path:
    """`rev`'s tree in `into/tree`, importable as `tapfix` from `into/pkg` (ahead of the editable install)."""
    tree, pkg = into / "tree", into / "pkg" / "tapfix"
    tree.mkdir(parents=True)
    pkg.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(HERE.parent), "archive", rev], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    for name in ("proxy", "addons", "schemas"):
        (pkg / name).symlink_to(tree / name)
    return tree


def child(root: Path, runs: int, pkg: Path | None) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(pkg)) if pkg is not None else dict(os.environ)
    command = [sys.executable, __file__, "--child", str(root), "--runs", str(runs)]
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout.splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=30, help="streams per case and round")
    ap.add_argument("--against", metavar="REV", help="also measure this commit, rounds alternating")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(measure(a.child, a.runs)))
        return
    with tempfile.TemporaryDirectory(prefix="tapfix-stream-cpu-") as tmp:
        sides: dict[str, tuple[Path, Path | None]] = {"this checkout": (HERE.parent, None)}
        if a.against:
            sides = {a.against: (export(a.against, Path(tmp)), Path(tmp) / "pkg"), **sides}
        results: dict[str, dict[str, list[float]]] = {name: {} for name in sides}
        for _ in range(a.rounds):
            for name, (root, pkg) in sides.items():
                for case, us in child(root, a.runs, pkg).items():
                    results[name].setdefault(case, []).append(us)
    print(f"CPU µs per event of the stream callable ({a.rounds} rounds × {a.runs} streams of 256 events)")
    print("median (min–max) over the rounds")
    for case in results["this checkout"]:
        cells = []
        for name in sides:
            values = results[name][case]
            cells.append(f"{name}: {statistics.median(values):6.2f} ({min(values):.2f}–{max(values):.2f})")
        print(f"  {case:22s} " + "   ".join(cells))


if __name__ == "__main__":
    main()
