"""Issue 37, usage always: a streamed chat request that didn't ask for usage is sent with
`stream_options.include_usage`, and the stream the client gets is the one it would have got without it."""

from __future__ import annotations

from pathlib import Path

import orjson
from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.mock.chat import DONE, ChunkBuilder
from tapfix.proxy.window.usage import UsageChunkStrip, ask_for_usage

# Real vLLM answers to the same request without and with the option (../shared/vllm-samples/hermes/01, 02)
SAMPLES = Path(__file__).resolve().parents[1] / "vectors" / "vllm"


def events_of(body: bytes) -> list[bytes]:
    return [part + b"\n\n" for part in body.split(b"\n\n") if part.strip()]


def through(events: list[bytes]) -> tuple[list[bytes], UsageChunkStrip]:
    strip = UsageChunkStrip()
    out = [e for event in events for e in strip.feed(event)]
    return out + strip.flush(), strip


def test_the_option_is_added_only_where_the_client_did_not_ask():
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'
    assert ask_for_usage(body) == (body[:-1] + b',"stream_options":{"include_usage":true}}', None)
    kept = b'{"model":"m","stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":false}}'
    asked, before = ask_for_usage(kept)
    assert before is False and orjson.loads(asked)["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": False,
    }
    assert ask_for_usage(b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}') is None
    assert ask_for_usage(b'{"model":"m"}') is None  # not a stream: the answer has usage
    assert ask_for_usage(b'{"model":"m","stream":false}') is None
    assert ask_for_usage(b'{"stream":true,"stream_options":"x"}') is None  # the engine's own error answers that
    assert ask_for_usage(b"not json") is None


def test_a_real_vllm_stream_with_usage_becomes_the_one_without():
    """vLLM moves `system_fingerprint` from the last choice chunk to the usage chunk when usage is asked for
    (its real answers, with and without the option): the strip puts it back."""
    with_usage = events_of((SAMPLES / "stream_chat_usage.body").read_bytes())
    without = events_of((SAMPLES / "stream_chat.body").read_bytes())
    out, strip = through(with_usage)
    assert len(out) == len(with_usage) - 1 and not any(b'"usage"' in e for e in out)
    assert out[:-2] == with_usage[:-3]  # every other event is the same bytes
    finish, finish_without = orjson.loads(out[-2][6:]), orjson.loads(without[-2][6:])
    assert list(finish) == list(finish_without)  # the same members, in the same order
    assert finish["system_fingerprint"] == finish_without["system_fingerprint"]
    assert out[-2].endswith(b',"system_fingerprint":"vllm-0.32.0-b423a8a2"}\n\n') and out[-1] == b"data: [DONE]\n\n"
    assert strip.change() is not None and strip.change().before["prompt_tokens"] == 18


def test_llamacpp_timings_go_back_on_the_last_choice_chunk():
    """llama.cpp (server-task.cpp, to_json_oaicompat_chat_stream) adds `timings` last to the stream's last
    chunk: the usage chunk when asked, else the finish chunk (tests/process/realengine/test_usage.py shows it
    on the real llama-server)."""
    head = b'"created":1,"id":"c","model":"m","object":"chat.completion.chunk","system_fingerprint":"b1"'
    timings = b'{"cache_n":0,"predicted_ms":1.5,"prompt_n":12}'
    content = b'data: {"choices":[{"delta":{"content":"hi"},"finish_reason":null,"index":0}],' + head + b"}\n\n"
    finish = b'data: {"choices":[{"delta":{},"finish_reason":"stop","index":0}],' + head
    usage = b'data: {"choices":[],' + head + b',"timings":' + timings + b',"usage":{"prompt_tokens":12}}\n\n'
    asked = [content, finish + b"}\n\n", usage, DONE]
    not_asked = [content, finish + b',"timings":' + timings + b"}\n\n", DONE]
    assert through(asked)[0] == not_asked


def test_null_usage_members_go_and_a_stream_without_usage_passes_as_it_came():
    chunk = b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}],"usage":null}\n\n'
    assert through([chunk, DONE])[0] == [chunk.replace(b',"usage":null', b""), DONE]
    plain = events_of((SAMPLES / "stream_chat.body").read_bytes())
    out, strip = through(plain)
    assert out == plain and all(a is b for a, b in zip(out, plain, strict=True)) and strip.change() is None


@given(
    pieces=st.lists(st.text(min_size=1, max_size=8), max_size=12),
    reason=st.sampled_from(["stop", "length", "tool_calls"]),
    prompt=st.integers(1, 100_000),
)
def test_any_mock_stream_with_usage_strips_to_the_one_without(pieces, reason, prompt):
    """The mock writes vLLM's bytes both ways (fingerprint on the usage chunk when one follows)."""
    builder = ChunkBuilder("chatcmpl-1", 1, "m")
    body = [builder.role("assistant")] + [builder.content(p) for p in pieces]
    asked = body + [builder.finish(reason, usage_follows=True), builder.usage(prompt, len(pieces)), DONE]
    assert through(asked)[0] == body + [builder.finish(reason), DONE]
