"""The benchmark scripts still reach what they measure: a module move must break them loudly.

`bench/` is not imported by the suite, so a rename in `proxy/` could leave a script timing a
fallback (or nothing) without any test noticing. Every `tapfix.*` name a script imports, at the
top or inside a function, and every `tapfix.*` module it runs with `python -m`, must resolve.

And the rows that price regeneration (issues 19 and 34) measure what they say: the agents' path rows
(`--regenerate 1`, tools offered) and their `--regenerate 0` twins send each request upstream once, with
no later attempt; the ratio line and `bench/run --baseline` compare like for like; the stream lane reads
every delta and its delay.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(BENCH.glob("*.py"))
MODULE_NAME = re.compile(r"^tapfix\.(proxy|addons)(\.\w+)*$")


def _targets(path: Path) -> list[tuple[str, str | None]]:
    """(module, attribute or None) for every tapfix import and `-m tapfix...` string in a script."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tapfix"):
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names if alias.name.startswith("tapfix")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.match(node.value):
            found.append((node.value, None))
    return found


def test_there_are_bench_scripts_with_tapfix_imports() -> None:
    assert sum(len(_targets(p)) for p in SCRIPTS) >= 5


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_tapfix_name_a_bench_script_uses_resolves(script: Path) -> None:
    missing = []
    for module, attr in _targets(script):
        if importlib.util.find_spec(module) is None:
            missing.append(module)
        elif attr is not None:
            mod = importlib.import_module(module)
            if not hasattr(mod, attr) and importlib.util.find_spec(f"{module}.{attr}") is None:
                missing.append(f"{module}.{attr}")
    assert not missing, f"{script.name} uses names that no longer exist: {missing}"


# -- regeneration's cost (issues 19, 34): the agents' path rows against --regenerate 0 twins ------------


def _bench(name: str) -> Any:
    """A bench script as a module (they import their siblings by bare name, so bench/ goes on the path)."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


def test_every_agents_path_row_has_a_regenerate_0_twin_in_every_cpu_phase() -> None:
    runner = _bench("runner")
    by_name = {r.name: r for r in runner.ROWS}
    agents = {r.name for r in runner.ROWS if r.target == "tapfix" and r.tools}
    assert agents == {on for _, on, _ in runner.PAIRS} and len(agents) == 2
    assert runner.ROWS[2].name == runner.AGENTS, "the agents' path comes first after the baselines"
    for _, on, off in runner.PAIRS:
        a, b = by_name[on], by_name[off]
        assert (b.target, b.tools, b.kind) == ("tapfix0", a.tools, a.kind)
    cpu = [p for p in runner.PHASES if p.name in ("cpu256", "cpu16")]
    assert len(cpu) == 2
    for phase in cpu:
        ran = {r.name for r in runner.rows_of(phase)}
        assert ran >= {name for _, on, off in runner.PAIRS for name in (on, off)} | {runner.MITM}, phase.name
    memory = [p for p in runner.PHASES if p.body == runner.MB]
    assert [{r.name for r in runner.rows_of(p)} for p in memory] == [{runner.MITM, runner.AGENTS, runner.AGENTS0}]
    assert runner.LANE_ROWS == ("direct", runner.MITM, runner.AGENTS, runner.AGENTS0)


def test_the_twin_is_the_same_tapfix_command_with_regenerate_0_last(tmp_path: Path) -> None:
    runner = _bench("runner")
    fleet = runner.Fleet(tmp_path, ["--regenerate", "1", "--engine", "vllm"])
    on = fleet.tapfix_argv("tapfix", "http://127.0.0.1:1", 2)
    off = fleet.tapfix_argv("tapfix0", "http://127.0.0.1:1", 2)
    db_on, db_off = on.index("--db") + 1, off.index("--db") + 1
    assert on[db_on] != off[db_off]  # two stores: the captures of one row never land in the other's
    assert off[:-2] == [*on[:db_on], off[db_off], *on[db_on + 1 :]]
    assert off[-2:] == ["--regenerate", "0"] and on[on.index("--regenerate") + 1] == "1"


def test_the_export_twin_is_the_capture_only_command_with_otlp_last_in_the_cpu_phases(tmp_path: Path) -> None:
    """Issue 20's ratio (export on vs off) means something only if the two processes differ in --otlp
    alone and serve the same requests (capture only) in both CPU phases of the fit."""
    runner = _bench("runner")
    fleet = runner.Fleet(tmp_path, ["--regenerate", "1", "--engine", "vllm"])
    fleet.otlp = "http://127.0.0.1:9"
    off = fleet.tapfix_argv("tapfix", "http://127.0.0.1:1", 2)
    on = fleet.tapfix_argv("tapfixotel", "http://127.0.0.1:1", 2)
    db_off, db_on = off.index("--db") + 1, on.index("--db") + 1
    assert on[db_on] != off[db_off]
    assert on[:-2] == [*off[:db_off], on[db_on], *off[db_off + 1 :]]
    assert on[-2:] == ["--otlp", "http://127.0.0.1:9"] and "--otlp" not in off
    by_name = {r.name: r for r in runner.ROWS}
    a, b = by_name[runner.EXPORT], by_name[runner.CAPTURE]
    assert (a.target, a.tools, a.kind) == ("tapfixotel", b.tools, b.kind) == ("tapfixotel", False, "content")
    for phase in (p for p in runner.PHASES if p.name in ("cpu256", "cpu16")):
        assert {runner.EXPORT, runner.CAPTURE} <= {r.name for r in runner.rows_of(phase)}, phase.name


def _cell(runner: Any, per_round: list[tuple[float, float]], chunks: int, n: int) -> Any:
    """A cell whose rounds cost what (µs per chunk, ms fixed) says, for `n` requests of `chunks` events."""
    cell = runner.Cell()
    for per_chunk_us, fixed_ms in per_round:
        ns = round(n * (fixed_ms * 1e6 + chunks * per_chunk_us * 1000))
        cell.rounds.append((ns, n))
        cell.cpu_ns += ns
        cell.requests += n
    return cell


def test_the_regenerate_line_gives_the_pooled_ratios_and_each_rounds_spread() -> None:
    runner = _bench("runner")
    costs = {  # (µs per chunk, fixed ms) of round 1 and round 2
        runner.AGENTS: [(60.0, 3.0), (66.0, 3.3)],
        runner.AGENTS0: [(50.0, 2.0), (60.0, 2.2)],
        runner.CALLS: [(40.0, 4.0), (40.0, 4.0)],
        runner.CALLS0: [(40.0, 2.0), (40.0, 2.0)],
    }
    results = {ph: {row: _cell(runner, c, chunks, 8) for row, c in costs.items()} for ph, chunks in CPU_PHASES}
    nums = {}
    for row in costs:
        long, short = results["cpu256"][row], results["cpu16"][row]
        per_chunk, fixed = runner.fit(long.cpu_ns / long.requests, short.cpu_ns / short.requests)
        nums[row] = {"per_chunk_us": per_chunk / 1000, "fixed_ms": fixed / 1e6}
    lines, raw = runner.regenerate_lines(results, nums, {"tapfix": 300 * 1024, "tapfix0": 200 * 1024})
    assert lines[0].startswith(
        "INFO  regenerate 1 vs 0: CPU/chunk 1.15×, fixed CPU/request 1.50× (agents' path, no calls"
    )
    assert "CPU/chunk 1.00×, fixed CPU/request 2.00× (tool call: 40.0 vs 40.0 µs, 4.00 vs 2.00 ms)" in lines[0]
    assert lines[0].endswith("; RSS peak (32 streams × 1 MB bodies) 300 vs 200 MB")
    armed = next(line for line in lines if "agents' path, no calls, 2 rounds" in line)
    assert "CPU/chunk ratio 1.10–1.20 sd 0.07" in armed and "fixed ratio 1.50–1.50 sd 0.00" in armed
    assert "µs/chunk 1: 60.0–66.0" in armed and "0: 50.0–60.0" in armed
    assert [round(x, 3) for x in raw["agents' path, no calls"]["per_chunk_ratio"]] == [1.2, 1.1]


CPU_PHASES = (("cpu256", 256), ("cpu16", 16))


@pytest.mark.parametrize(
    ("wanted", "current", "baseline", "mine", "theirs"),
    [
        (None, True, True, ["--regenerate", "1"], ["--regenerate", "1"]),  # both know it: the default
        (None, True, False, ["--regenerate", "0"], []),  # an older baseline: this side on the direct path too
        (None, False, True, [], ["--regenerate", "0"]),
        (0, True, True, ["--regenerate", "0"], ["--regenerate", "0"]),
        (None, False, False, [], []),
    ],
)
def test_versus_gives_both_sides_the_same_regenerate(
    wanted: int | None, current: bool, baseline: bool, mine: list[str], theirs: list[str]
) -> None:
    assert _bench("versus").regenerate_args(wanted, current, baseline)[:2] == (mine, theirs)


def test_versus_refuses_regeneration_the_older_side_does_not_have() -> None:
    with pytest.raises(SystemExit, match="predates the flag"):
        _bench("versus").regenerate_args(1, True, False)


def test_a_lane_level_is_sustained_without_loss_within_one_gap_of_direct() -> None:
    lane = _bench("lane")

    def cell(delays_ms: list[float], lost: int = 0) -> Any:
        c = lane.Cell()
        c.res.delay, c.res.lost = [d / 1000 for d in delays_ms], lost
        return c

    direct = cell([1.0] * 100)
    assert lane.sustained(direct, None)
    assert lane.sustained(cell([1.0] * 99 + [20.9]), direct)  # p99 (nearest rank): 1 ms, +0 ms
    assert lane.sustained(cell([20.9] * 100), direct)  # +19.9 ms: within one gap
    assert not lane.sustained(cell([21.5] * 100), direct)
    assert not lane.sustained(cell([1.0] * 100, lost=1), direct)


def test_a_verdict_shows_what_was_measured_and_passes_the_right_way() -> None:
    verdict = _bench("runner").verdict
    assert verdict("streams sustained on one core ≥ 128", 64.0, 128.0, "streams", at_least=True).startswith(
        "MISS  streams sustained on one core ≥ 128: 64.00 (streams; 50% of the target)"
    )
    assert verdict("streams sustained on one core ≥ 128", 256.0, 128.0, "streams", at_least=True).startswith("PASS")
    assert verdict("RSS peak, 32 streams × 1 MB bodies ≤ 150 MB", 140.0, 150.0, "MB").startswith(
        "PASS  RSS peak, 32 streams × 1 MB bodies ≤ 150 MB: 140.00 (MB"
    )
    assert ": 1.38× (" in verdict("CPU/chunk ≤ 1.25× mitmproxy", 1.38, 1.25, "a vs b").replace("MISS  ", "")


def test_the_upstreams_stream_events_name_the_model_as_vllm_does() -> None:
    upstream = _bench("upstream")
    events = [*upstream.sse_events("content", 16), *upstream.sse_events("tools", 16)]
    events += [upstream.STAMP_HEAD.split(b"\r\n")[1], upstream.stamped_delta(0).split(b"\r\n")[1]]
    models = {orjson.loads(e.removeprefix(b"data: "))["model"] for e in events if b"[DONE]" not in e}
    assert models == {"bench-model"} == {upstream.MODEL_ENTRY["id"]}


def test_the_upstreams_window_holds_the_longest_prompt_a_phase_sends() -> None:
    """Else a vLLM refuses it, and tapfix, told its count, answers it itself: the phase would measure refusals."""
    upstream, runner, load = _bench("upstream"), _bench("runner"), _bench("load")
    longest = max(p.body for p in runner.PHASES)
    body = load.request_body(longest, tools=True)
    count = orjson.loads(upstream.tokenize_answer(body))["count"]
    assert count > longest // 8  # a count, not a token
    assert count + orjson.loads(body)["max_tokens"] <= upstream.MODEL_ENTRY["max_model_len"]
