"""What working out each turn's prefix break costs the capture writer's thread (store/prefix_breaks.py).

Why: the writer parses every chat, Responses and Messages request and digests its prompt parts to find the
previous request of its thread, on the thread that also stores, while holding the GIL against the event
loop. A Claude-Code-shaped session of TURNS turns (a 20 KB system prompt, 15 tools, the history growing to
about 1 MB) goes through one `PrefixTracker`; every 10th turn changes its billing line (a break: the
previous body is parsed again). CPU time per turn (`time.process_time`), by body size.

    .venv/bin/python bench/prefix_break.py [--turns 120]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import orjson
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.prefix_breaks import PrefixTracker

LINE = "x-anthropic-billing-header: cc_version=2.1.332.{:03x}; cc_entrypoint=sdk-cli;"


def session(turns: int) -> list[bytes]:
    tools = [{"name": f"T{i}", "description": "d" * 2000, "input_schema": {"type": "object"}} for i in range(15)]
    messages: list[dict[str, Any]] = []
    bodies = []
    for turn in range(turns):
        messages.append({"role": "user", "content": [{"type": "text", "text": f"step {turn} " * 300}]})
        system = [{"type": "text", "text": LINE.format(turn // 10)}, {"type": "text", "text": "x" * 20000}]
        bodies.append(orjson.dumps({"model": "m", "system": system, "tools": tools, "messages": messages}))
        call = {"type": "tool_use", "id": f"t{turn}", "name": "Bash", "input": {"command": "ls " * 200}}
        messages.append({"role": "assistant", "content": [{"type": "text", "text": "ok " * 300}, call]})
    return bodies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=120)
    args = parser.parse_args()
    tracker = PrefixTracker()
    costs: list[tuple[int, float, bool]] = []
    for body in session(args.turns):
        ex = Exchange(path="/v1/messages", request=body, request_headers=[("x-claude-code-session-id", "bench")])
        start = time.process_time()
        found = tracker.observe(ex, "bench", own_session=False)
        costs.append((len(body), (time.process_time() - start) * 1000, found is not None))
    for low, high in ((0, 100_000), (100_000, 500_000), (500_000, 10**9)):
        plain = [ms for size, ms, broke in costs if low <= size < high and not broke]
        broken = [ms for size, ms, broke in costs if low <= size < high and broke]
        if plain:
            sizes = f"bodies {low // 1000}-{min(high, 10**7) // 1000} KB"
            line = f"{sizes}: {len(plain)} turns, median {statistics.median(plain):.2f} ms"
            if broken:
                line += f"; {len(broken)} with a break, median {statistics.median(broken):.2f} ms"
            print(line)
    print(f"breaks found: {sum(broke for *_, broke in costs)} (billing line every 10th turn)")


if __name__ == "__main__":
    main()
