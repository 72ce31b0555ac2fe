"""Issue 38: llama.cpp slot pinning through the real proxy. A scripted upstream plays a llama-server run with
`-np 2`: it records each request's `id_slot` and answers with llama.cpp's `timings`, whose `cache_n` counts the
prompt tokens an earlier request on the same slot left in its cache (as llama-server's own does; its usage says
nothing of the cache, as older builds' didn't). Clients are the OpenAI and Anthropic SDKs."""

from __future__ import annotations

import gzip
import json
import threading

import anthropic
import httpx
import openai
import pytest

from tests.support.builders import chat_chunk, sse_events
from tests.support.inproc import cli, start
from tests.support.procs import wait_capture
from tests.support.rawserver import RawRequest, RawServer, json_reply, sse_response

PROMPT_TOKENS = 40
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {}}}}]


class LlamaLike:
    """Answers chat completions (whole or streamed) and Messages; `seen` is each inference request's body."""

    def __init__(self, delay: float = 0.0, fail_first: int = 0) -> None:
        self.delay = delay
        self.fail_first = fail_first  # answer this many inference requests 503 first
        self.seen: list[tuple[str, dict]] = []
        self.by_slot: dict[int, int] = {}
        self.server = RawServer(self.respond)

    def respond(self, request: RawRequest) -> list[tuple[float, bytes]]:
        path = request.path.split("?")[0]
        if not path.endswith(("/completions", "/messages", "/responses")):
            return [(0.0, b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")]
        body = json.loads(request.body)
        self.seen.append((path, body))
        if len(self.seen) <= self.fail_first:
            busy = b'{"error": {"message": "busy", "type": "server_error"}}'
            return [(0.0, b"HTTP/1.1 503 Service Unavailable\r\n" + json_reply(busy).split(b"\r\n", 1)[1])]
        if path.endswith(("/responses", "/v1/completions")):  # only what reaches the upstream is looked at here
            return [(self.delay, json_reply(b'{"error": {"message": "not played", "type": "server_error"}}'))]
        if path.endswith("/messages"):
            answer = {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "tiny",
                "content": [{"type": "text", "text": "ok"}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": PROMPT_TOKENS, "output_tokens": 1},
            }
            return [(self.delay, json_reply(json.dumps(answer).encode()))]
        slot = body.get("id_slot", -1)
        cache_n = PROMPT_TOKENS if self.by_slot.get(slot) else 0  # an earlier turn on this slot left its prompt
        self.by_slot[slot] = self.by_slot.get(slot, 0) + 1
        timings = {"cache_n": cache_n, "prompt_n": PROMPT_TOKENS - cache_n, "predicted_n": 1}
        usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 1, "total_tokens": PROMPT_TOKENS + 1}
        if not body.get("stream"):
            message = {"role": "assistant", "content": "ok"}
            answer = {
                "id": "c1",
                "created": 0,
                "model": "tiny",
                "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": usage,
                "timings": timings,
            }
            return [(self.delay, json_reply(json.dumps(answer).encode()))]
        last = {**chat_chunk(model="tiny"), "choices": [], "usage": usage, "timings": timings}  # llama-server's
        events = [chat_chunk({"role": "assistant", "content": "ok"}, model="tiny"), chat_chunk({}, "stop"), last]
        script = sse_response(sse_events(events))
        return [(self.delay, script[0][1]), *script[1:]]

    def slots_of(self, task: str) -> list[object]:
        """The id_slot of each chat request of the thread whose task is `task`, in order."""
        return [
            b.get("id_slot", "absent")
            for p, b in self.seen
            if p.endswith("/chat/completions") and b["messages"][1]["content"] == task
        ]


@pytest.fixture
def llama():
    upstream = LlamaLike()
    yield upstream
    upstream.server.close()


def run_proxy(tmp_path, url: str, upstream: str = "slots = 2"):
    config = tmp_path / "tapfix.toml"
    config.write_text(
        f'[upstreams.llama]\nbase_url = "{url}/v1"\nengine = "llamacpp"\n{upstream}\n\n'
        '[models.coder]\nupstream = "llama"\nupstream_model = "tiny"\n'
    )
    db = tmp_path / "captures.db"
    proxy = start(["--config", str(config), "--db", str(db)], tmp_path / "proxy.log")
    proxy.extra["db"] = db
    return proxy


def turn(proxy, task: str, turns: int, headers: dict[str, str] | None = None, stream: bool = False, tools=None):
    """The thread's `turns`-th turn: its system prompt and task, then a reply and a follow-up per earlier turn."""
    messages = [{"role": "system", "content": "you code"}, {"role": "user", "content": task}]
    for i in range(1, turns):
        messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"next {i}"}]
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0, default_headers=headers or {})
    extra = {"tools": tools} if tools else {}
    if not stream:
        raw = client.chat.completions.with_raw_response.create(model="coder", messages=messages, **extra)
        return raw.headers["x-tapfix-capture-id"]
    with client.chat.completions.with_streaming_response.create(
        model="coder", messages=messages, stream=True, **extra
    ) as raw:
        assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices) == "ok"
        return raw.headers["x-tapfix-capture-id"]


def slot_of(proxy, capture_id: str) -> dict:
    return json.loads(wait_capture(proxy.extra["db"], capture_id)["route_decision"])["slot"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_each_threads_turns_stay_on_one_slot_and_the_capture_says_what_its_cache_served(tmp_path, llama, stream):
    proxy = run_proxy(tmp_path, llama.server.url)
    try:
        ids = {}
        for n in (1, 2, 3):  # two threads' turns interleaved
            for task in ("task A", "task B"):
                ids[task, n] = turn(proxy, task, n, stream=stream)
        assert llama.slots_of("task A") == [0, 0, 0]
        assert llama.slots_of("task B") == [1, 1, 1]
        first, second = slot_of(proxy, ids["task A", 1]), slot_of(proxy, ids["task A", 2])
        assert (first["slot"], first["how"], first["cache_n"]) == (0, "free", 0)
        assert (second["slot"], second["how"], second["cache_n"]) == (0, "kept", PROMPT_TOKENS)
        row = wait_capture(proxy.extra["db"], ids["task B", 3])
        assert row["cached_tokens"] == PROMPT_TOKENS, "cache_n fills the count the usage didn't give"
        changes = json.loads(cli("captures", "show", ids["task B", 3], "--json", "--db", str(proxy.extra["db"])).stdout)
        assert changes["route_decision"]["slot"]["slot"] == 1
        assert {"stage": "router", "path": "$.id_slot", "after": 1}.items() <= next(
            c for c in changes["changes"] if c["path"] == "$.id_slot"
        ).items()
        text = cli("captures", "show", ids["task B", 3], "--db", str(proxy.extra["db"])).stdout.decode()
        line = next(x for x in text.splitlines() if x.strip().startswith("slot:"))
        assert "slot: 1 on llama (kept)" in line and f"cache_n {PROMPT_TOKENS} prompt tokens" in line
    finally:
        proxy.stop()


def test_concurrent_threads_get_different_slots_and_a_third_takes_the_least_recently_used(tmp_path):
    llama = LlamaLike(delay=0.5)
    proxy = run_proxy(tmp_path, llama.server.url)
    try:
        workers = [threading.Thread(target=turn, args=(proxy, task, 1)) for task in ("task A", "task B")]
        for w in workers:
            w.start()
        for w in workers:
            w.join(20)
        assert sorted(llama.slots_of("task A") + llama.slots_of("task B")) == [0, 1]
        a = llama.slots_of("task A")[0]
        turn(proxy, "task A", 2)  # A was used last: B's slot is the least recently used
        c = turn(proxy, "task C", 1)
        assert llama.slots_of("task C") == [1 - a]
        assert slot_of(proxy, c)["how"] == "evicted"
        turn(proxy, "task A", 3)
        assert llama.slots_of("task A") == [a, a, a]
    finally:
        proxy.stop()
        llama.server.close()


def test_responses_and_a_named_sessions_legacy_completions_are_pinned(tmp_path, llama):
    proxy = run_proxy(tmp_path, llama.server.url)
    try:
        for path, body, headers in [
            ("responses", {"model": "coder", "instructions": "you code", "input": "hi"}, {}),
            ("completions", {"model": "coder", "prompt": "def f():"}, {"x-session-id": "s1"}),
            ("completions", {"model": "coder", "prompt": "def g():"}, {}),
        ]:
            httpx.post(f"{proxy.url}/v1/{path}", json=body, headers=headers, timeout=10)
        assert [(p.rsplit("/", 1)[-1], b.get("id_slot")) for p, b in llama.seen] == [
            ("responses", 0),
            ("completions", 1),
            ("completions", None),  # no session named: no conversation to pin
        ]
    finally:
        proxy.stop()


def test_a_compressed_request_is_pinned_and_goes_upstream_decoded(tmp_path, llama):
    proxy = run_proxy(tmp_path, llama.server.url)
    try:
        body = json.dumps({"model": "coder", "messages": [{"role": "user", "content": "hi"}]}).encode()
        headers = {"content-encoding": "gzip", "content-type": "application/json"}
        answer = httpx.post(f"{proxy.url}/v1/chat/completions", content=gzip.compress(body), headers=headers)
        assert answer.status_code == 200
        request = llama.server.requests[-1]
        assert request.header("content-encoding") is None and json.loads(request.body)["id_slot"] == 0
        capture_id = answer.headers["x-tapfix-capture-id"]
        wait_capture(proxy.extra["db"], capture_id)  # the writer commits after the answer went out
        shown = json.loads(cli("captures", "show", capture_id, "--json", "--db", str(proxy.extra["db"])).stdout)
        assert {"headers.content-encoding", "$.id_slot"} <= {c["path"] for c in shown["changes"]}
    finally:
        proxy.stop()


def test_messages_requests_are_not_pinned(tmp_path, llama):
    proxy = run_proxy(tmp_path, llama.server.url)
    try:
        client = anthropic.Anthropic(base_url=proxy.url, api_key="k", max_retries=0)
        for _ in range(2):
            raw = client.messages.with_raw_response.create(
                model="coder", max_tokens=20, system="you code", messages=[{"role": "user", "content": "hi"}]
            )
        assert [("id_slot" in b) for p, b in llama.seen] == [False, False], "llama.cpp ignores id_slot there"
        row = wait_capture(proxy.extra["db"], raw.headers["x-tapfix-capture-id"])
        assert row["route_decision"] is None
    finally:
        proxy.stop()


def test_a_reserved_slot_keeps_the_main_agent_through_a_subagent_fan_out(tmp_path, llama):
    proxy = run_proxy(tmp_path, llama.server.url, "slots = 2\nreserve_main_slot = true")
    session = {"x-session-id": "ses_main"}
    try:
        main = turn(proxy, "the task", 1, session, tools=TOOLS)
        for i in range(3):  # opencode's task tool: child sessions naming their parent
            child = {"x-session-id": f"ses_child{i}", "x-parent-session-id": "ses_main"}
            sub = turn(proxy, f"subtask {i}", 1, child, tools=TOOLS)
        turn(proxy, "the task", 2, session, tools=TOOLS)
        assert llama.slots_of("the task") == [0, 0]
        assert [llama.slots_of(f"subtask {i}") for i in range(3)] == [[1], [1], [1]]
        assert slot_of(proxy, main)["role"] == "main" and slot_of(proxy, sub)["role"] == "subagent"
    finally:
        proxy.stop()


def test_the_clients_own_id_slot_stands_and_a_misspelt_slot_id_is_flagged(tmp_path, llama):
    proxy = run_proxy(tmp_path, llama.server.url)
    try:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
        hi = [{"role": "user", "content": "hi"}]
        own = client.chat.completions.with_raw_response.create(model="coder", messages=hi, extra_body={"id_slot": 1})
        typo = client.chat.completions.with_raw_response.create(model="coder", messages=hi, extra_body={"slot_id": 1})
        assert llama.seen[0][1]["id_slot"] == 1
        assert (llama.seen[1][1]["slot_id"], llama.seen[1][1]["id_slot"]) == (1, 0)
        assert slot_of(proxy, own.headers["x-tapfix-capture-id"])["how"] == "client"
        row = wait_capture(proxy.extra["db"], typo.headers["x-tapfix-capture-id"])
        assert "slot_id_ignored" in json.loads(row["flags"])
    finally:
        proxy.stop()


def test_replicas_pin_apart_and_a_fallback_pins_the_thread_on_the_upstream_it_moved_to(tmp_path):
    gpu0, gpu1 = LlamaLike(fail_first=1), LlamaLike()
    config = tmp_path / "tapfix.toml"
    config.write_text(
        "".join(
            f'[upstreams.{name}]\nbase_url = "{u.server.url}/v1"\nengine = "llamacpp"\nslots = 2\n\n'
            for name, u in (("gpu0", gpu0), ("gpu1", gpu1))
        )
        + '[models.coder]\nupstream = "gpu1"\nupstream_model = "tiny"\n\n'
        '[[models.coder.routes]]\nname = "gpus"\nupstream = ["gpu0", "gpu1"]\n'
    )
    db = tmp_path / "captures.db"
    proxy = start(["--config", str(config), "--db", str(db)], tmp_path / "proxy.log")
    proxy.extra["db"] = db
    try:
        b1 = turn(proxy, "task B", 1)  # gpu0 answers 503: B falls over to gpu1, where it is pinned to gpu1's slot 0
        a = turn(proxy, "task A", 1)  # A on gpu0, its slot 0 there
        b2 = turn(proxy, "task B", 2)  # affinity keeps B on gpu1, on its slot there
        # B's failed try took gpu0's slot 0, which B keeps there (a pin outlives a failed request) as A takes 1
        assert [b.get("id_slot") for _, b in gpu0.seen] == [0, 1]
        assert gpu1.slots_of("task B") == [0, 0] and gpu1.slots_of("task A") == []
        assert slot_of(proxy, a)["upstream"] == "gpu0"
        record = slot_of(proxy, b2)
        assert (record["upstream"], record["slot"], record["how"]) == ("gpu1", 0, "kept")
        wait_capture(db, b1)
        shown = json.loads(cli("captures", "show", b1, "--json", "--db", str(db)).stdout)
        slot_changes = [(c["before"], c["after"]) for c in shown["changes"] if c["path"] == "$.id_slot"]
        assert slot_changes == [(None, 0), (None, 0)], "gpu0's pin, then gpu1's, each recorded"
        assert shown["route_decision"]["slot"]["upstream"] == "gpu1"
    finally:
        proxy.stop()
        gpu0.server.close()
        gpu1.server.close()


def test_slots_on_an_engine_without_them_fails_the_check(tmp_path):
    config = tmp_path / "tapfix.toml"
    config.write_text(
        '[upstreams.gpu]\nbase_url = "http://127.0.0.1:9/v1"\nengine = "vllm"\nslots = 4\n\n'
        '[models.coder]\nupstream = "gpu"\n'
    )
    result = cli("check", "--config", str(config))
    out = (result.stdout + result.stderr).decode()
    assert result.returncode == 1 and "upstreams.gpu.slots: only a llama.cpp upstream" in out, out
