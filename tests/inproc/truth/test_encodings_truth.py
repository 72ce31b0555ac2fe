"""Issue 15 item 5 (compressed bodies) and item 10's `[reasoning_field]` rename of non-streamed bodies.

Through real processes: the client → `tapfix run` → `tapfix mock`, the mock compressing its answers
(`compress`, `compress_lie` in a scenario rule) whatever the stripped Accept-Encoding said; the request
side against a raw upstream that records the exact bytes it got. The client reads raw bytes
(`iter_raw`), so what is compared is what went over the wire, not what httpx decoded.
"""

from __future__ import annotations

import gzip
import json
import sys
import zlib

import brotli
import httpx
import pytest

from tests.inproc.test_e2e_request_side import RENAME_CONFIG as REQUEST_SIDE_RENAME_CONFIG
from tests.inproc.test_e2e_request_side import _run, renaming_proxy
from tests.support.inproc import cli, start_mock, start_proxy
from tests.support.procs import wait_capture
from tests.support.rawserver import RawServer, json_upstreams

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
}
TOOLS = [{"type": "function", "function": {"name": "write", "description": "Write a file", "parameters": SCHEMA}}]
PROMPT = 'Create hello.txt containing "hi there"'
ARGS = {"path": "hello.txt", "content": "hi there\n"}
ENCODINGS = ("gzip", "br", "zstd", "deflate")
RULES = [
    *({"when": {"model": f"{e}-plain"}, "do": "answer", "compress": e} for e in ENCODINGS),
    *(
        {"when": {"model": f"{e}-broken"}, "do": "break_tool_call", "mode": "unclosed", "compress": e}
        for e in ENCODINGS
    ),
    {"when": {"model": "gzip-reset"}, "do": "reset_mid_stream", "after_chunks": 4, "compress": "gzip"},
    {"when": {"model": "gzip-lie"}, "do": "answer", "compress": "gzip", "compress_lie": True},
    {
        "when": {"model": "gzip-lie-broken"},
        "do": "break_tool_call",
        "mode": "unclosed",
        "compress": "gzip",
        "compress_lie": True,
    },
]


def decode(data: bytes, encoding: str) -> bytes:
    """The test's own decoders (the standard library and the codec packages), not tapfix's."""
    if encoding == "gzip":
        return gzip.decompress(data)
    if encoding == "deflate":
        return zlib.decompress(data)
    if encoding == "br":
        return brotli.decompress(data)
    return zstd.decompress(data)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("encodings")
    (tmp / "scenario.json").write_text(json.dumps({"rules": RULES}))
    mock = start_mock(tmp, "--scenario", str(tmp / "scenario.json"))
    proxy = start_proxy(tmp, mock.url, shared=True)
    yield mock, proxy
    proxy.stop()
    mock.stop()


def _post(proxy, body: dict, headers: dict | None = None) -> tuple[httpx.Headers, bytes, int]:
    with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json=body, headers=headers, timeout=30) as r:
        return r.headers, b"".join(r.iter_raw()), r.status_code


def _row(proxy, capture_id: str) -> dict:
    row = wait_capture(proxy.extra["db"], capture_id)
    row["flags"] = json.loads(row["flags"] or "[]")
    row["tool_calls"] = json.loads(row["tool_calls"] or "[]")
    return row


def _export(proxy, capture_id: str, which: str) -> bytes:
    wait_capture(proxy.extra["db"], capture_id)  # the writer commits within its batch window
    out = cli("captures", "export", capture_id, which, "--db", str(proxy.extra["db"]))
    assert out.returncode == 0, out.stderr
    return out.stdout


def _changes(proxy, capture_id: str) -> list[dict]:
    wait_capture(proxy.extra["db"], capture_id)  # the writer commits within its batch window
    out = cli("captures", "show", capture_id, "--json", "--db", str(proxy.extra["db"]))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["changes"]


def _sse_args(body: bytes) -> dict:
    """The tool call's arguments a client assembles from the deltas of a plain SSE stream."""
    text = ""
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:]).get("choices", []):
                for call in (choice.get("delta") or {}).get("tool_calls") or []:
                    text += (call.get("function") or {}).get("arguments") or ""
    return json.loads(text)


def _sse_content(body: bytes) -> str:
    text = ""
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:]).get("choices", []):
                text += (choice.get("delta") or {}).get("content") or ""
    return text


# -- responses -----------------------------------------------------------------------------------
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_truth_5_compressed_stream_passes_through(stack, encoding):
    """No stage armed: the client gets the upstream's compressed bytes; the capture reads them decoded."""
    _, proxy = stack
    body = {"model": f"{encoding}-plain", "stream": True, "messages": [{"role": "user", "content": "What is 6 * 7?"}]}
    headers, raw, status = _post(proxy, body)
    assert status == 200 and headers["content-encoding"] == encoding
    assert _sse_content(decode(raw, encoding)) == "6 * 7 = 42."
    capture_id = headers["x-tapfix-capture-id"]
    row = _row(proxy, capture_id)
    assert row["content"] == "6 * 7 = 42." and row["finish_reason"] == "stop"
    assert "empty_answer" not in row["flags"] and "undecodable_body" not in row["flags"]
    assert row["client_response_body_id"] is None  # the client got the upstream's bytes
    assert _export(proxy, capture_id, "--response") == raw  # stored as they arrived: compressed
    assert row["first_token_ms"] is not None


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_truth_5_compressed_stream_tool_call_repaired(stack, encoding):
    """A repair stage armed: the stream goes out decoded (and repaired), Content-Encoding dropped, recorded."""
    _, proxy = stack
    body = {
        "model": f"{encoding}-broken",
        "stream": True,
        "tools": TOOLS,
        "messages": [{"role": "user", "content": PROMPT}],
    }
    headers, raw, status = _post(proxy, body)
    assert status == 200 and "content-encoding" not in headers
    assert _sse_args(raw) == ARGS  # the unclosed `}` was repaired before the client saw it
    capture_id = headers["x-tapfix-capture-id"]
    row = _row(proxy, capture_id)
    assert json.loads(row["tool_calls"][0]["arguments"]) == ARGS
    assert "empty_answer" not in row["flags"] and "toolcall_repaired" in row["flags"]
    upstream = _export(proxy, capture_id, "--response")
    assert upstream != raw and not upstream.startswith(b"data:")  # the upstream's bytes, still compressed
    assert b'"tool_calls"' in decode(upstream, encoding)
    assert _export(proxy, capture_id, "--client-response") == raw
    framing = [c for c in _changes(proxy, capture_id) if c["path"] == "headers.content-encoding"]
    assert framing and framing[0]["stage"] == "framing" and framing[0]["before"] == encoding


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_truth_5_compressed_json_body(stack, encoding):
    """Non-streamed: unchanged bodies keep their compression; a repaired one goes out decoded."""
    _, proxy = stack
    plain = {"model": f"{encoding}-plain", "messages": [{"role": "user", "content": "What is 6 * 7?"}]}
    headers, raw, _ = _post(proxy, plain)
    assert headers["content-encoding"] == encoding
    assert json.loads(decode(raw, encoding))["choices"][0]["message"]["content"] == "6 * 7 = 42."
    row = _row(proxy, headers["x-tapfix-capture-id"])
    assert row["content"] == "6 * 7 = 42." and "empty_answer" not in row["flags"]
    assert row["client_response_body_id"] is None
    assert _export(proxy, row["id"], "--response") == raw

    broken = {"model": f"{encoding}-broken", "tools": TOOLS, "messages": [{"role": "user", "content": PROMPT}]}
    headers, raw, status = _post(proxy, broken)
    assert status == 200 and "content-encoding" not in headers
    assert int(headers["content-length"]) == len(raw)
    call = json.loads(raw)["choices"][0]["message"]["tool_calls"][0]
    assert json.loads(call["function"]["arguments"]) == ARGS
    row = _row(proxy, headers["x-tapfix-capture-id"])
    assert json.loads(row["tool_calls"][0]["arguments"]) == ARGS and "empty_answer" not in row["flags"]
    upstream = _export(proxy, row["id"], "--response")
    assert upstream != raw and json.loads(decode(upstream, encoding))["choices"][0]["message"]["tool_calls"]
    framing = [c for c in _changes(proxy, row["id"]) if c["path"] == "headers.content-encoding"]
    assert framing and framing[0]["stage"] == "framing"


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("model", ["gzip-lie", "gzip-lie-broken"])
def test_truth_5_undecodable_body_passes_through(stack, stream, model):
    """`Content-Encoding: gzip` over plain bytes: forwarded exactly as it came, flagged undecodable_body."""
    _, proxy = stack
    body = {"model": model, "stream": stream, "messages": [{"role": "user", "content": PROMPT}]}
    if model.endswith("broken"):
        body["tools"] = TOOLS
    headers, raw, status = _post(proxy, body)
    assert status == 200
    capture_id = headers["x-tapfix-capture-id"]
    row = _row(proxy, capture_id)
    assert "undecodable_body" in row["flags"]
    assert _export(proxy, capture_id, "--response") == raw
    assert row["client_response_body_id"] is None


def test_truth_5_compressed_stream_reset_adds_no_plain_bytes(stack):
    """The client reads gzip: tapfix's plain retryable error event would corrupt it, so none is added."""
    _, proxy = stack
    body = {"model": "gzip-reset", "stream": True, "messages": [{"role": "user", "content": "Count to 5"}]}
    received = b""
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json=body, timeout=30) as response:
            assert response.headers["content-encoding"] == "gzip"
            capture_id = response.headers["x-tapfix-capture-id"]
            for piece in response.iter_raw():
                received += piece
    text = zlib.decompressobj(31).decompress(received)
    assert text.startswith(b"data: {") and b"server_error" not in received
    row = _row(proxy, capture_id)
    assert "upstream_reset" in row["flags"] and row["content"]  # assembled from the decoded part
    assert _export(proxy, capture_id, "--client-response") == received


def test_truth_5_stream_that_stops_decoding_midway():
    """Stages armed, text already sent: the stream ends with a retryable error event, recorded;
    no stage armed: the bytes pass as they came and the record falls back to them."""
    from tapfix.proxy.content_encoding import Decoder
    from tapfix.proxy.exchange import Exchange
    from tapfix.proxy.response.pipeline import StreamPipeline
    from tapfix.proxy.response.reasoning_fields import ReasoningFieldRename

    z = zlib.compressobj(wbits=31)
    good = z.compress(b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n') + z.flush(zlib.Z_SYNC_FLUSH)
    bad = b"\xff" * 64
    ex = Exchange(path="/v1/chat/completions")
    pipeline = StreamPipeline(ex, [ReasoningFieldRename("reasoning", "reasoning_content")], Decoder("gzip"))
    first = pipeline(good)
    assert first.startswith(b"data: {") and b'"hi"' in first
    ended = pipeline(bad)
    assert b'"server_error"' in ended and b'"undecodable_body"' in ended and ended.endswith(b"data: [DONE]\n\n")
    assert pipeline(good) == [] and pipeline(b"") == []
    assert "undecodable_body" in ex.flags and ex.changes[-1].stage == "stream"
    assert ex.response_chunks == [good, bad, good] and ex.decoded_chunks is None

    ex = Exchange(path="/v1/chat/completions")
    pipeline = StreamPipeline(ex, [], Decoder("gzip"))
    assert pipeline(good) == good and pipeline(bad) == bad and pipeline(b"") == []
    assert "undecodable_body" in ex.flags and ex.decoded_chunks is None and pipeline.passes_encoded


def test_truth_5_decoders_take_any_pieces():
    """Chunk boundaries anywhere, gzip members and zstd frames in a row, raw deflate, coding chains."""
    import random

    from tapfix.proxy.content_encoding import DecodeError, Decoder, decode_whole

    data = b"".join(b'data: {"n": %d}\n\n' % i for i in range(3000))
    raw = zlib.compressobj(wbits=-15)
    encoded = [
        ("gzip", gzip.compress(data)),
        ("x-gzip", gzip.compress(data[:100]) + gzip.compress(data[100:])),
        ("deflate", zlib.compress(data)),
        ("deflate", raw.compress(data) + raw.flush()),
        ("br", brotli.compress(data)),
        ("zstd", zstd.compress(data[:100]) + zstd.compress(data[100:])),
        ("gzip, br", brotli.compress(gzip.compress(data))),
    ]
    rng = random.Random(15)
    for coding, body in encoded:
        decoder, out, i = Decoder(coding), b"", 0
        while i < len(body):
            n = rng.randint(1, 700)
            out, i = out + decoder.feed(body[i : i + n]), i + n
        assert out + decoder.finish(strict=True) == data, coding
        with pytest.raises(DecodeError):
            decode_whole(body[: len(body) // 2], coding)  # a whole body cut short is not decodable
    with pytest.raises(DecodeError):
        Decoder("compress")


def test_truth_5_decoding_stops_at_a_size_limit():
    """A small compressed body that inflates past the limit stops there instead of filling memory."""
    from tapfix.proxy.content_encoding import DecodedTooLarge, DecodeError, Decoder

    bombs = {
        "gzip": gzip.compress(b"\0" * 8_000_000),
        "deflate": zlib.compress(b"\0" * 8_000_000),
        "br": brotli.compress(b"\0" * 8_000_000),
        "zstd": zstd.compress(b"\0" * 8_000_000),
    }
    for encoding, bomb in bombs.items():
        decoder = Decoder(encoding, limit=1_000_000)
        with pytest.raises(DecodedTooLarge):
            decoder.feed(bomb)
        assert decoder.total <= 1_000_000, encoding
        whole = Decoder(encoding, limit=8_000_000)
        assert whole.feed(bomb) + whole.finish() == b"\0" * 8_000_000
    with pytest.raises(DecodeError):
        Decoder("gzip").feed(b"data: {}\n\n")


# -- requests ------------------------------------------------------------------------------------


@pytest.fixture
def upstreams():
    with json_upstreams(2) as servers:
        yield servers


def _send_gzip(proxy, payload: bytes) -> httpx.Response:
    return httpx.post(
        f"{proxy.url}/v1/chat/completions",
        content=gzip.compress(payload),
        headers={"content-type": "application/json", "content-encoding": "gzip"},
        timeout=60,
    )


def test_truth_5_compressed_request_body_quick_mode(tmp_path, upstreams):
    upstream = upstreams[0]
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_p": 0.95}))
    gen = str(tmp_path / "generation_config.json")
    proxy = _run(tmp_path, "--upstream", upstream.url, "--engine", "vllm", "--generation-config", gen)
    try:
        # The policy fills sampling defaults: the decoded, edited body goes out, framing fixed.
        payload = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
        response = _send_gzip(proxy, payload)
        assert response.status_code == 200
        got = upstream.requests[-1]
        assert got.header("content-encoding") is None and int(got.header("content-length")) == len(got.body)
        sent = json.loads(got.body)
        assert (sent["model"], sent["temperature"], sent["top_p"]) == ("m", 0.6, 0.95)
        capture_id = response.headers["x-tapfix-capture-id"]
        row = _row(proxy, capture_id)
        assert row["model"] == "m" and "encoded_request_body" not in row["flags"]
        assert gzip.decompress(_export(proxy, capture_id, "--original")) == payload  # kept as it arrived
        assert _export(proxy, capture_id, "--forwarded") == got.body
        changes = _changes(proxy, capture_id)
        assert any(c["stage"] == "sampling" for c in changes)
        framing = [c for c in changes if c["path"] == "headers.content-encoding"]
        assert framing and framing[0]["before"] == "gzip"

        # The policy changes nothing (the client sent its own sampling): the original bytes go out.
        payload = json.dumps({"model": "m", "temperature": 0.2, "top_p": 0.5, "messages": []}).encode()
        compressed = gzip.compress(payload)
        response = httpx.post(
            f"{proxy.url}/v1/chat/completions",
            content=compressed,
            headers={"content-type": "application/json", "content-encoding": "gzip"},
        )
        assert response.status_code == 200
        got = upstream.requests[-1]
        assert got.header("content-encoding") == "gzip" and got.body == compressed
        row = _row(proxy, response.headers["x-tapfix-capture-id"])
        assert row["model"] == "m" and row["forwarded_body_id"] is None
    finally:
        proxy.stop()


def _posts(server: RawServer) -> list:
    """What the server got apart from the start-up check's GET /v1/models."""
    return [r for r in server.requests if r.head.startswith(b"POST ")]


CONFIG = """
[upstreams.a]
base_url = "{a}"
engine = "vllm"

[upstreams.b]
base_url = "{b}"
engine = "vllm"

[models."model-a"]
upstream = "a"

[models."model-b"]
upstream = "b"
upstream_model = "served-b"
"""


def test_truth_5_compressed_request_body_config_mode(tmp_path, upstreams):
    a, b = upstreams
    config = tmp_path / "tapfix.toml"
    config.write_text(CONFIG.format(a=a.url, b=b.url))
    proxy = _run(tmp_path, "--config", str(config))
    try:
        # Routed by the model inside the compressed body; nothing to change: the original bytes.
        compressed = gzip.compress(json.dumps({"model": "model-a", "temperature": 0.3, "messages": []}).encode())
        response = httpx.post(
            f"{proxy.url}/v1/chat/completions",
            content=compressed,
            headers={"content-type": "application/json", "content-encoding": "gzip"},
        )
        assert response.status_code == 200, response.text
        assert len(_posts(a)) == 1 and a.requests[-1].body == compressed
        assert a.requests[-1].header("content-encoding") == "gzip"

        # The served id differs: the renamed body goes out decoded.
        response = _send_gzip(proxy, json.dumps({"model": "model-b", "temperature": 0.3, "messages": []}).encode())
        assert response.status_code == 200, response.text
        got = b.requests[-1]
        assert json.loads(got.body)["model"] == "served-b" and got.header("content-encoding") is None
        assert int(got.header("content-length")) == len(got.body)
        framing = [c for c in _changes(proxy, response.headers["x-tapfix-capture-id"]) if c["stage"] == "framing"]
        assert any(c["path"] == "headers.content-encoding" for c in framing)

        # A body that inflates past 64 MiB is refused before anything is forwarded.
        bomb = b'{"model":"model-a","messages":[]}' + b" " * (64 * 1024 * 1024 + 1)
        response = _send_gzip(proxy, bomb)
        assert response.status_code == 413
        assert response.json()["error"]["type"] == "invalid_request_error"
        assert response.json()["error"]["code"] == "request_too_large"
        assert len(_posts(a)) == 1 and len(_posts(b)) == 1
    finally:
        proxy.stop()


# -- item 10: the reasoning-field rename of non-streamed bodies ------------------------------------
# The request-side suite's rename config, plus a model whose answers the mock compresses.
RENAME_CONFIG = (
    REQUEST_SIDE_RENAME_CONFIG
    + """
[models."gzip-plain"]
upstream = "mock"
"""
)


def test_truth_10_reasoning_field_non_stream(tmp_path):
    (tmp_path / "scenario.json").write_text(json.dumps({"rules": RULES}))
    with renaming_proxy(tmp_path, RENAME_CONFIG, "--scenario", str(tmp_path / "scenario.json")) as proxy:
        body = {
            "model": "tapfix-mock",
            "reasoning_effort": "high",
            "messages": [{"role": "user", "content": "think about it"}],
        }
        headers, raw, status = _post(proxy, body, {"user-agent": "opencode/1.18.33 ai-sdk"})
        assert status == 200
        message = json.loads(raw)["choices"][0]["message"]
        assert message.get("reasoning_content") and "reasoning" not in message
        assert int(headers["content-length"]) == len(raw)
        capture_id = headers["x-tapfix-capture-id"]
        row = _row(proxy, capture_id)
        assert row["reasoning"] == message["reasoning_content"] and row["client_response_body_id"] is not None
        assert b'"reasoning":' in _export(proxy, capture_id, "--response")
        shown = cli("captures", "show", capture_id, "--db", str(proxy.extra["db"])).stdout.decode()
        assert "[reasoning_field] rename" in shown

        _, raw, _ = _post(proxy, body, {"user-agent": "omp/18.2.3"})  # another client: untouched
        message = json.loads(raw)["choices"][0]["message"]
        assert message.get("reasoning") and "reasoning_content" not in message

        # A compressed body the rename changes goes out decoded, like a repaired one.
        headers, raw, _ = _post(proxy, {**body, "model": "gzip-plain"}, {"user-agent": "opencode/1.18.33 ai-sdk"})
        assert "content-encoding" not in headers
        assert json.loads(raw)["choices"][0]["message"].get("reasoning_content")


def test_mock_compresses_each_event_on_its_own(tmp_path):
    """The scripted upstream these tests rely on: every streamed event decodes as it arrives."""
    from starlette.testclient import TestClient
    from tapfix.proxy.mock.app import create_app
    from tapfix.proxy.mock.options import MockOptions

    (tmp_path / "scenario.json").write_text(json.dumps({"rules": RULES}))
    client = TestClient(create_app(MockOptions(scenario=tmp_path / "scenario.json")))
    for encoding in ENCODINGS:
        body = {
            "model": f"{encoding}-plain",
            "stream": True,
            "messages": [{"role": "user", "content": "What is 6 * 7?"}],
        }
        with client.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.headers["content-encoding"] == encoding
            pieces = list(response.iter_raw())
        assert len(pieces) > 3 and _sse_content(decode(b"".join(pieces), encoding)) == "6 * 7 = 42."
        plain = client.post(
            "/v1/chat/completions", json={**body, "stream": False}, headers={"accept-encoding": "identity"}
        )
        assert plain.json()["choices"][0]["message"]["content"] == "6 * 7 = 42."  # content-length matches
