"""Repair and assembly cost against argument size (1 KB, 100 KB, 1 MB): must grow linearly.

Why: a streamed tool call carrying a whole file is common (write_file), and the proxy touches its
arguments twice: the tool-call repair stage on the event loop (per event, while the client waits)
and the capture writer's assembly of the stored message (writer thread, holding the GIL against
the event loop). Either one going quadratic stalls every stream through the proxy.

The stage's own benchmark (`python -m tapfix.proxy.toolcalls.bench`, owned by the tool-call work)
is run first (a missing one is an error); this script adds the writer-side `assemble_sse` over the same streams and
over long plain-text replies, and prints µs per event and the growth factor per 10× size.

    .venv/bin/python bench/repair.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import orjson
from tapfix.proxy.assemble import assemble_sse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repo's tests/ helpers
from tests.support.timing import best_of  # noqa: E402


def tool_stream(size: int, fragment: int = 16) -> list[bytes]:
    """One write_file call whose arguments are ~size bytes, `fragment` characters per event."""
    line = 'print("hello, world")  # a line of code with "quotes" and \\ slashes\n'
    args = orjson.dumps({"path": "big.py", "content": (line * (size // len(line) + 1))[:size]}).decode()

    def ev(delta: dict, finish: str | None = None) -> bytes:
        return (
            b"data: "
            + orjson.dumps(
                {
                    "id": "c",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": "m",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }
            )
            + b"\n\n"
        )

    events = [
        ev({"role": "assistant", "content": ""}),
        ev(
            {
                "tool_calls": [
                    {"index": 0, "id": "c1", "type": "function", "function": {"name": "write", "arguments": ""}}
                ]
            }
        ),
    ]
    events += [
        ev({"tool_calls": [{"index": 0, "function": {"arguments": args[i : i + fragment]}}]})
        for i in range(0, len(args), fragment)
    ]
    return events + [ev({}, "tool_calls"), b"data: [DONE]\n\n"]


def text_stream(size: int) -> list[bytes]:
    """A plain reply of ~size bytes of content, one ~5-byte token per event."""
    ev = (
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
        b'"choices":[{"index":0,"delta":{"content":"word "},"finish_reason":null}]}\n\n'
    )
    return [ev] * (size // 5) + [b"data: [DONE]\n\n"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--max-kb", type=int, default=1000, help="largest size (1000 = 1 MB)")
    a = ap.parse_args()
    # No fallback: if a move loses the stage benchmark, this script must fail, not time something else.
    print("== repair stage (python -m tapfix.proxy.toolcalls.bench)")
    sys.stdout.flush()
    subprocess.run([sys.executable, "-m", "tapfix.proxy.toolcalls.bench", "--repeat", str(a.repeat)], check=True)
    print("\n== capture writer: assemble_sse (runs in the writer thread, holding the GIL)")
    print(f"{'case':<24}{'events':>8}{'ms total':>11}{'µs/event':>10}{'growth/10×':>12}")
    assemble_sse(tool_stream(10_000))  # warm up (first-call costs would inflate the 1 KB row)
    for label, make in (("tool-call arguments", tool_stream), ("plain content", text_stream)):
        prev = None
        for size in (1_000, 10_000, 100_000, a.max_kb * 1000):
            events = make(size)
            s = best_of(lambda events=events: assemble_sse(events), a.repeat if size < 500_000 else 1)
            per = s * 1e6 / len(events)
            growth = f"{per / prev:.1f}×" if prev else ""
            print(f"{label + f' {size // 1000} KB':<24}{len(events):>8}{s * 1e3:>11.1f}{per:>10.2f}{growth:>12}")
            prev = per
    print("\nlinear = µs/event stays flat (growth ≈ 1×); quadratic = it grows ~10× per 10× size")


if __name__ == "__main__":
    main()
