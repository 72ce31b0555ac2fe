"""What reasoning replay adds to a request (issue 36): a 200-turn agent session (each turn a tool call with
~600 characters of reasoning, then its result), its last request through the real `RequestPolicy.apply`,
with replay off, with every turn in memory, and with none in memory (each read from a SQLite store the real
`CaptureWriter` filled, by the indexed `chain_hash`).

    .venv/bin/python bench/replay_reasoning.py [--turns 200] [--rounds 30]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import orjson
from tapfix.proxy.assemble import Assembled
from tapfix.proxy.config.file import from_dict
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.request.policy import RequestPolicy
from tapfix.proxy.store.replay_turns import RecentTurns, store_lookup
from tapfix.proxy.store.sqlite.store import SqliteStore
from tapfix.proxy.store.writer import CaptureWriter

AGENT, ADDR = "opencode/1.0", "127.0.0.1"
SYSTEM = {"role": "system", "content": "You are a coding agent. " * 200}
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]


def _session(turns: int) -> tuple[list[bytes], list[dict[str, object]]]:
    """Each turn's request and the answer the upstream gave it (reasoning and one tool call)."""
    messages: list[dict[str, object]] = [SYSTEM, {"role": "user", "content": "refactor the module"}]
    requests, answers = [], []
    for i in range(turns):
        requests.append(orjson.dumps({"model": "m", "messages": messages, "tools": TOOLS, "stream": False}))
        call = {"id": f"functions.read:{i}", "type": "function", "function": {"name": "read", "arguments": ""}}
        call["function"] = {"name": "read", "arguments": orjson.dumps({"path": f"src/f{i}.py"}).decode()}
        reasoning = f"Turn {i}: I need to look at src/f{i}.py before changing it. " * 10
        answers.append({"role": "assistant", "content": None, "reasoning": reasoning, "tool_calls": [call]})
        sent = {"role": "assistant", "content": None, "tool_calls": [call]}  # the client drops the reasoning
        messages = [*messages, sent, {"role": "tool", "tool_call_id": call["id"], "content": "x = 1\n" * 300}]
    return requests, answers


def _exchange(request: bytes, answer: dict[str, object]) -> Exchange:
    body = {
        "id": "c",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": answer, "finish_reason": "tool_calls"}],
    }
    return Exchange(
        path="/v1/chat/completions",
        method="POST",
        request=request,
        status=200,
        client_addr=ADDR,
        user_agent=AGENT,
        request_headers=[("user-agent", AGENT)],
        content_type="application/json",
        response=orjson.dumps(body),
    )


def _policy(replay: bool, turns: RecentTurns | None) -> RequestPolicy:
    config = {
        "upstreams": {"u": {"base_url": "http://127.0.0.1:9/v1", "engine": "vllm"}},
        "models": {"m": {"upstream": "u", "replay_reasoning": replay}},
    }
    policy = RequestPolicy(from_dict(config))
    policy.turns = turns
    return policy


def _ms(policy: RequestPolicy, body: bytes, rounds: int, expect: int) -> tuple[float, float]:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        out = policy.apply("/v1/chat/completions", body, {"user-agent": AGENT}, ADDR)
        times.append((time.perf_counter() - started) * 1000)
        assert sum(1 for c in out.changes if c.kind == "replay_reasoning") == expect, out.changes[:2]
    return statistics.median(times), max(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    requests, answers = _session(args.turns + 1)
    last = requests[-1]
    memory = RecentTurns()
    for request, answer in zip(requests[:-1], answers[:-1], strict=True):
        ex = _exchange(request, answer)
        call = answer["tool_calls"][0]  # type: ignore[index]
        tool_call = {"id": call["id"], "name": "read", "arguments": call["function"]["arguments"]}
        memory.note(ex, Assembled(content="", reasoning=str(answer["reasoning"]), tool_calls=[tool_call]))
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "c.db"
        writer = CaptureWriter(db)
        for request, answer in zip(requests[:-1], answers[:-1], strict=True):
            writer.submit(_exchange(request, answer))
        writer.close()
        stored = RecentTurns(lookup=store_lookup(SqliteStore(db).reader))
        rows = [
            ("replay off", _ms(_policy(False, None), last, args.rounds, 0)),
            ("replay on, turns in memory", _ms(_policy(True, memory), last, args.rounds, args.turns)),
            ("replay on, turns from the store (SQLite)", _ms(_policy(True, stored), last, args.rounds, args.turns)),
        ]
    print(
        f"{args.turns}-turn session, last request {len(last) / 1e6:.2f} MB, RequestPolicy.apply, {args.rounds} rounds"
    )
    for name, (median, worst) in rows:
        print(f"  {name:<42} median {median:7.2f} ms   max {worst:7.2f} ms")


if __name__ == "__main__":
    main()
