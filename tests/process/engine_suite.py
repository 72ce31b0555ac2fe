"""What the two real-engine suites share (llama.cpp's llama-server: tests/process/realengine/, marker `realengine`;
vLLM: tests/process/vllm/, marker `vllm`): getting the engine from a cache script, the relay and fault-relay
fixtures between tapfix and the engine, and the checks that hold whatever the engine is. Each engine's package
keeps what is its own: how it is built or installed and started, its model, and the wire details the checks
are given (which key the engine moves onto its usage chunk, which delta field carries its reasoning).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.process.realengine.fault_relay import Cut, FaultRelay
from tests.process.realengine.relay import Relay, chat_stream_through, split_events
from tests.support.builders import DONE, chat_chunk, message_tool_call, sse_event, tool_call_delta
from tests.support.ci import unavailable
from tests.support.inproc import InprocProxy
from tests.support.procs import wait_capture
from tests.support.rawserver import RawServer, sse_response

ROOT = Path(__file__).resolve().parents[2]


def cache_root() -> Path:
    """Where built things outlive the clone: the engines and the tiny models."""
    return Path(os.environ.get("TAPFIX_CACHE") or Path.home() / ".cache" / "tapfix")


class EngineUnavailable(Exception):
    """This machine can't provide the engine; the message says why (the fixture turns it into a skip
    locally, a failure under CI)."""


@dataclass(frozen=True)
class Provisioned:
    """The directory a cache script printed, how long the call took, and its stderr (its progress lines)."""

    dir: Path
    seconds: float
    output: str


def run_cache_script(script: Path, timeout: float, *, cannot_status: int, must_hold: str) -> Provisioned:
    """Run a script that builds or installs an engine into the cache (a quick print of the directory when the
    cache holds it). Exit `cannot_status` means this machine can't have it (the script says why); the one line
    it prints must name a directory holding `must_hold`."""
    name = f"scripts/{script.name}"
    started = time.monotonic()
    try:
        result = subprocess.run([str(script)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise EngineUnavailable(f"{name} did not finish within {timeout:.0f}s") from exc
    seconds = time.monotonic() - started
    if result.returncode == cannot_status:
        raise EngineUnavailable(f"{name} can't provide its engine here: {result.stderr.strip()}")
    if result.returncode != 0:
        raise EngineUnavailable(f"{name} failed (exit {result.returncode}); its output ends:\n{result.stderr[-6000:]}")
    lines = result.stdout.strip().splitlines()
    if len(lines) != 1 or not (Path(lines[0]) / must_hold).exists():
        raise EngineUnavailable(f"{name} printed no directory holding {must_hold}: {result.stdout!r}")
    return Provisioned(Path(lines[0]), seconds, result.stderr)


def provided[P: Provisioned](provide: Callable[[], P], suite: str, made: str, news: Callable[[P], str]) -> P:
    """The engine for a session fixture: the suite skips (locally) or fails (under CI) with the reason when the
    machine can't provide it; a run that `made` it (built, installed) prints `news(it)` and the time it took."""
    try:
        engine = provide()
    except EngineUnavailable as exc:
        unavailable(f"{suite}: {exc}")
    if f"{made} " in engine.output:
        print(f"\n{news(engine)} in {engine.seconds:.0f}s")
    return engine


def http_status(port: int, method: str, path: str, timeout: float) -> int | None:
    """The status of one loopback request, or None while nothing answers (the engine is still starting)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path)
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


def check_a_warm_run_reuses_the_cache(
    script: Path, engine: Provisioned, kept: Path, within: float, timeout: float, leftovers: str
) -> None:
    """A second run of a cache script prints the same directory within `within` seconds, leaves `kept` (the
    binary, the venv) as it was and nothing matching `leftovers` (a glob under the cache) behind."""
    before = kept.stat().st_mtime_ns
    started = time.monotonic()
    result = subprocess.run([str(script)], capture_output=True, text=True, timeout=timeout)
    seconds = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(engine.dir)]
    assert seconds < within, f"a warm run took {seconds:.1f}s: {result.stderr}"
    assert kept.stat().st_mtime_ns == before, f"the warm run replaced {kept}"
    assert not list(cache_root().glob(leftovers)), "a run left its work behind"


def run_with_only(script: Path, tools: tuple[str, ...], tmp: Path) -> subprocess.CompletedProcess[str]:
    """A cache script run by bash with nothing on its PATH but `tools` (those this machine has), and a cache
    and home of its own under `tmp`: what it does on a machine that lacks the rest."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    for tool in tools:
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    env = {"PATH": str(bin_dir), "HOME": str(tmp), "TAPFIX_CACHE": str(tmp / "cache")}
    return subprocess.run([str(bin_dir / "bash"), str(script)], capture_output=True, text=True, env=env, timeout=60)


# --- fixtures ------------------------------------------------------------------------------------


def stopped_at_the_end[T](start: Callable[..., T]) -> Iterator[Callable[..., T]]:
    """For a fixture to `yield from`: `start`, remembering what it started, each stopped (or closed) when the
    fixture ends."""
    started: list[T] = []

    def starting(*args: Any, **kw: Any) -> T:
        thing = start(*args, **kw)
        started.append(thing)
        return thing

    yield starting
    for thing in started:
        (getattr(thing, "stop", None) or thing.close)()


def relayed(server: str, *tapfix_args: str) -> tuple[Any, Any]:
    """The module fixtures `relay` (a recording relay in front of the engine the fixture `server` names) and
    `proxy` (`tapfix run *tapfix_args` in front of that relay), for `relay, proxy = relayed(...)`."""

    @pytest.fixture(scope="module", name="relay")
    def relay_fixture(request: pytest.FixtureRequest) -> Iterator[Relay]:
        witness = Relay(request.getfixturevalue(server).port)
        yield witness
        witness.close()

    @pytest.fixture(scope="module", name="proxy")
    def proxy_fixture(tapfix_in_front: Callable[..., InprocProxy], relay: Relay) -> InprocProxy:
        return tapfix_in_front(relay, *tapfix_args)  # tapfix's upstream is the relay, which forwards to the engine

    return relay_fixture, proxy_fixture


@pytest.fixture
def cut_in_front(
    tapfix_in_front: Callable[..., InprocProxy],
) -> Iterator[Callable[..., tuple[FaultRelay, InprocProxy]]]:
    """`(server, cut, *tapfix args)` -> a fault relay in front of the server and `tapfix run` in front of it."""
    relays: list[FaultRelay] = []

    def start(server: Any, cut: Cut, *args: str) -> tuple[FaultRelay, InprocProxy]:
        relay = FaultRelay(server.port, cut)
        relays.append(relay)
        return relay, tapfix_in_front(relay, *args)

    yield start
    for relay in relays:
        relay.close()


# --- checks --------------------------------------------------------------------------------------


def check_usage_asked_for_and_kept_from_the_client(
    proxy: InprocProxy, relay: Relay, body: dict[str, Any], moved: str, timeout: float = 60
) -> None:
    """Issue 37: a streamed chat request without `stream_options.include_usage` is sent with it, the capture
    gets the engine's usage, and the client gets the stream the engine writes without the option: no usage
    chunk, and `moved` (what the engine writes on the usage chunk when there is one, else last on the last
    choice chunk) back at the end of the last choice chunk; the rest is the engine's bytes."""
    received, capture_id, server, forwarded = chat_stream_through(proxy.url, relay, body, timeout=timeout)
    assert forwarded["stream_options"] == {"include_usage": True}
    got, sent = split_events(received), split_events(server)
    usage = json.loads(sent[-2][6:])
    assert usage["choices"] == [] and moved in usage  # the engine's own answer to the option
    assert got[:-2] == sent[:-3] and got[-1] == sent[-1] == b"data: [DONE]\n\n"  # the rest: the same bytes
    last, engines_last = json.loads(got[-2][6:]), json.loads(sent[-3][6:])
    assert last == engines_last | {moved: usage[moved]}
    assert list(last) == [*engines_last, moved]  # where the engine writes it without the option
    row = wait_capture(proxy.extra["db"], capture_id)
    assert row["prompt_tokens"] == usage["usage"]["prompt_tokens"] > 0
    assert row["completion_tokens"] == usage["usage"]["completion_tokens"]


def check_a_client_that_asked_gets_the_engines_bytes(
    proxy: InprocProxy, relay: Relay, body: dict[str, Any], timeout: float = 60
) -> None:
    asked = body | {"stream_options": {"include_usage": True}}
    received, _, server, forwarded = chat_stream_through(proxy.url, relay, asked, timeout=timeout)
    assert received == server and forwarded["stream_options"] == {"include_usage": True}


@dataclass
class Read:
    """What the OpenAI SDK assembled from a streamed chat completion."""

    capture_id: str
    ids: set[str] = field(default_factory=set)
    content: str = ""
    reasoning: str = ""
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    finish: list[str] = field(default_factory=list)
    error: openai.APIError | None = None  # the stream's error event, as the SDK raises it


def sdk_stream(proxy: InprocProxy, reasoning_field: str, timeout: float, **request: Any) -> Read:
    """One streamed chat completion through the OpenAI SDK (`max_retries=0`); `reasoning_field` is the delta
    field the engine streams its reasoning in (the SDK keeps fields it doesn't know)."""
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0, timeout=timeout)
    raw = client.chat.completions.with_raw_response.create(stream=True, **request)
    read = Read(raw.headers["x-tapfix-capture-id"])
    try:
        for chunk in raw.parse():
            read.ids.add(chunk.id)
            for choice in chunk.choices:
                delta = choice.delta
                read.content += delta.content or ""
                read.reasoning += getattr(delta, reasoning_field, None) or ""
                for call in delta.tool_calls or []:
                    got = read.calls.setdefault(call.index, {"name": "", "arguments": ""})
                    got["name"] += (call.function and call.function.name) or ""
                    got["arguments"] += (call.function and call.function.arguments) or ""
                if choice.finish_reason:
                    read.finish.append(choice.finish_reason)
    except openai.APIError as e:
        read.error = e
    return read


@dataclass(frozen=True)
class ReasoningTurns:
    """A scripted upstream for reasoning replay (issue 36), answering as the engine answers a reasoning model
    (the tiny models can't be made to reason on demand): turn 1 streams `reasoning` in the engine's delta
    field, then a call to `read` whose arguments arrive in `arguments` parts; turn 2 streams `text`. `result`
    is what the client sends back as the call's result."""

    field: str
    reasoning: str
    arguments: tuple[str, ...]
    text: str
    result: str

    def answer(self, first_turn: int) -> Callable[[Any], Any]:
        chunk = partial(chat_chunk, id="c1", model="tiny")
        frame = partial(sse_event, ensure_ascii=True, separators=(", ", ": "))  # json.dumps' spacing and escaping

        def answer(request: Any) -> Any:
            if len(json.loads(request.body)["messages"]) == first_turn:
                head, *rest = self.arguments
                chunks = [
                    chunk({"role": "assistant", "content": None, self.field: self.reasoning}),
                    chunk({"tool_calls": [tool_call_delta(0, "call_1", "read", head)]}),
                    *(chunk({"tool_calls": [tool_call_delta(0, arguments=part)]}) for part in rest),
                    chunk({}, "tool_calls"),
                ]
            else:
                chunks = [chunk({"role": "assistant", "content": self.text}), chunk({}, "stop")]
            return sse_response([*map(frame, chunks), DONE])

        return answer


def replay_two_turns(
    tapfix_in_front: Callable[..., InprocProxy],
    engine: str,
    turns: ReasoningTurns,
    first: list[dict[str, Any]],
    tools: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Reasoning replay through `tapfix run --engine ENGINE --replay-reasoning` in front of the scripted upstream:
    turn 2 sends back the call the client read and its result, as an agent does (the SDK's assistant message
    has no reasoning). Returns turn 2's messages as the client sent them and as tapfix forwarded them."""
    upstream = RawServer(turns.answer(len(first)))
    try:
        proxy = tapfix_in_front(upstream, "--engine", engine, "--replay-reasoning")
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
        calls: dict[int, dict[str, Any]] = {}
        for chunk in client.chat.completions.create(model="tiny", messages=first, tools=tools, stream=True):  # type: ignore[call-overload]
            for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                slot = calls.setdefault(call.index, {"id": None, "name": "", "arguments": ""})
                slot["id"] = call.id or slot["id"]
                slot["name"] += call.function.name or ""
                slot["arguments"] += call.function.arguments or ""
        call = calls[0]
        tool_calls = [message_tool_call(call["arguments"], id=call["id"], name=call["name"])]
        assistant = {"role": "assistant", "content": "", "tool_calls": tool_calls}
        messages = [*first, assistant, {"role": "tool", "tool_call_id": call["id"], "content": turns.result}]
        list(client.chat.completions.create(model="tiny", messages=messages, tools=tools, stream=True))  # type: ignore[call-overload]
        forwarded = json.loads(upstream.requests[-1].body)["messages"]
    finally:
        upstream.close()
    return messages, forwarded
