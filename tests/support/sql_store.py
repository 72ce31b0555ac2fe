"""A capture store filled through the real `CaptureWriter`, for the SQL-function and plugin tests.

It holds every case `tapfix_body` distinguishes: a delta-compressed agent session (one family, longer
than a delta chain may be, so the chain restarts), a request tapfix changed before forwarding, an
answer the client got repaired, a non-UTF-8 body, and an exchange stored with `--no-bodies`.
`Filled.bodies` keeps the exact bytes each exchange was submitted with, per kind.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.bodies import MAX_DEPTH
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.builders import chat_chunk, sse_events
from tests.support.stores import streamed_chat

SESSION_TURNS = MAX_DEPTH + 12  # past one chain's depth: a second root, then deltas on it


@dataclass
class Filled:
    path: Path
    session: list[str] = field(default_factory=list)  # ids of the agent session's turns, oldest first
    ids: dict[str, str] = field(default_factory=dict)  # case name -> exchange id
    bodies: dict[str, dict[str, bytes]] = field(default_factory=dict)  # id -> kind -> bytes sent/answered


def _note(rng: random.Random) -> str:
    return "".join(rng.choice('abcdefghij \n"\\é') for _ in range(rng.randint(20, 400)))


def _answer(text: str) -> list[bytes]:
    return sse_events([chat_chunk({"role": "assistant", "content": text}), chat_chunk({}, "stop")])


def _exchange(request: bytes, answer: list[bytes], **kw: object) -> Exchange:
    return streamed_chat(
        request=request,
        response_chunks=answer,
        url="http://127.0.0.1:8000/v1/chat/completions",
        response_headers=[("content-type", "text/event-stream")],
        chunk_times=[0.001 * (i + 1) for i in range(len(answer))],
        **kw,
    )


def _record(filled: Filled, ex: Exchange) -> str:
    upstream = ex.response_body()
    filled.bodies[ex.id] = {
        "request": ex.request,
        "forwarded": ex.forwarded if ex.forwarded is not None else ex.request,
        "response": upstream,
        "client_response": ex.client_response_body(upstream),
    }
    return ex.id


def fill_store(path: Path, *, seed: int = 5, turns: int = SESSION_TURNS, notes: list[str] | None = None) -> Filled:
    """Write the cases above into a new store at `path` and close the writer (its WAL checkpointed).
    The session's user messages are `notes` when given (one per turn), else random ones."""
    filled, exchanges = store_cases(seed=seed, turns=turns, notes=notes)
    filled.path = path
    write_all(CaptureWriter(path), exchanges)
    return filled


def write_all(writer: CaptureWriter, exchanges: list[Exchange]) -> None:
    """Submit them in order, close the writer; any exchange not stored fails the caller."""
    try:
        for ex in exchanges:
            writer.submit(ex)
    finally:
        writer.close()
    if writer.stats.failures:
        raise RuntimeError(f"the writer failed: {writer.stats.last_error}")


def store_cases(
    *, seed: int = 5, turns: int = SESSION_TURNS, notes: list[str] | None = None
) -> tuple[Filled, list[Exchange]]:
    """The cases above as exchanges, in the order to submit them (the same ones can go to two stores)."""
    rng = random.Random(seed)
    filled = Filled(Path())
    exchanges = []
    messages: list[dict[str, object]] = [{"role": "system", "content": "You are a coding agent. " * 200}]
    headers = [("content-type", "application/json"), ("x-session-id", "ses_sql_test")]
    for turn in range(turns if notes is None else len(notes)):
        note = notes[turn] if notes is not None else _note(rng)
        messages = [*messages, {"role": "user", "content": f"turn {turn}: {note}"}]
        body = orjson.dumps({"model": "m", "messages": messages, "stream": True})
        ex = _exchange(body, _answer(f"answer {turn} ✓"), request_headers=headers)
        filled.session.append(_record(filled, ex))
        exchanges.append(ex)
        messages = [*messages, {"role": "assistant", "content": f"answer {turn} ✓"}]
    forwarded = _exchange(b'{"model":"m","messages":[]}', _answer("hi"), request_headers=headers[:1])
    forwarded.forwarded = b'{"model":"m","messages":[],"top_p":0.95}'
    forwarded.changes = [Change("sampling", "inject", "$.top_p", None, 0.95, "test")]
    repaired = _exchange(b'{"model":"m","messages":[]}', _answer("broken"))
    repaired.client_response = b"".join(_answer("repaired"))
    binary = _exchange(b'{"model":"m"}\xff\xfe\x00 not UTF-8', [b"\x1f\x8b\x08\x00 gzip-looking \xff"])
    binary.content_type = "application/octet-stream"
    private = _exchange(b'{"model":"m","messages":[{"role":"user","content":"secret"}]}', _answer("x"))
    private.store_bodies = False
    for name, ex in (("forwarded", forwarded), ("repaired", repaired), ("binary", binary), ("private", private)):
        filled.ids[name] = _record(filled, ex)
        exchanges.append(ex)
    return filled, exchanges


def _answer(text: str) -> list[bytes]:
    return sse_events([chat_chunk({"role": "assistant", "content": text}), chat_chunk({}, "stop")])


def agent_session(
    session: str, n: int, start: float | None = None, *, header: bool = True, step: float = 1.0
) -> list[Exchange]:
    """An agent session of `n` turns, each resending the conversation, the k-th started `start + k*step`."""
    start = time.time() if start is None else start
    messages: list[dict[str, str]] = [{"role": "system", "content": f"agent {session} " * 300}]
    out = []
    for k in range(n):
        messages = [*messages, {"role": "user", "content": f"{session} turn {k}: " + "tool output " * 40}]
        ex = Exchange(
            method="POST",
            path="/v1/chat/completions",
            model="m",
            stream=True,
            request=orjson.dumps({"model": "m", "messages": messages, "stream": True}),
            request_headers=[("x-session-id", session)] if header else [],
            user_agent=f"agent-{session}",
            started_at=start + k * step,
        )
        ex.status, ex.content_type = 200, "text/event-stream"
        ex.response_chunks = _answer(f"{session} answer {k}")
        ex.chunk_times = [0.001, 0.002]
        out.append(ex)
        messages = [*messages, {"role": "assistant", "content": f"{session} answer {k}"}]
    return out
