"""What counting a prompt adds to the first token (issue 37): an agent turn of ~100k tokens through
`tapfix run --engine llamacpp`, with an output budget (tapfix counts the prompt by the engine's own
`POST /apply-template` then `POST /tokenize`, to clamp the budget): a session's first turn (the whole prompt
tokenized) and its next turn (only the new part: proxy/window/counts.py); and without one (nothing is
counted), interleaved; and the whole count alone, asked directly, split into its two calls.

The count is the real llama-server's: tapfix's upstream is a relay that passes `/props`, `/v1/models`,
`/apply-template` and `/tokenize` to it and answers the chat itself at once, so the difference between the
two rows is the count, not the engine's prefill (which is the same with or without it: the tiny model's
prefill of 100k tokens on one thread of this machine takes most of an hour). Wall time (the added latency is
what the agent waits), median and spread over the rounds; the machine may be shared.

    .venv/bin/python bench/window_count.py [--tokens 100000] [--rounds 7] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: the repo's tests/ helpers
from tests.process.realengine.engine import build_llama_server, start_llama_server, tiny_model  # noqa: E402
from tests.support.procs import start_proxy  # noqa: E402

CODE = (
    "def handle(request):\n    body = request.json()\n    if not body.get('model'):\n"
    "        raise ValueError('model is required')\n    return route(body['model'], body)\n\n"
)


def conversation(turns: int) -> list[dict[str, str]]:
    """An agent session: opencode-like instructions, then read-file tool results and short replies."""
    messages = [{"role": "system", "content": "You are opencode, a coding agent. Follow the rules. " * 40}]
    for k in range(turns):
        messages.append({"role": "user", "content": f"Read src/module_{k}.py and fix the bug."})
        messages.append({"role": "assistant", "content": f"Reading src/module_{k}.py."})
        messages.append({"role": "user", "content": f"<file src/module_{k}.py>\n" + CODE * 12})
    messages.append({"role": "user", "content": "Now run the tests."})
    return messages


def count(client: httpx.Client, url: str, messages: list[dict[str, str]]) -> int:
    """As tapfix counts on llama.cpp (addons/window.py, Window.count)."""
    prompt = client.post(f"{url}/apply-template", json={"messages": messages}).json()["prompt"]
    return len(client.post(f"{url}/tokenize", json={"content": prompt}).json()["tokens"])


def first_token_s(client: httpx.Client, url: str, body: dict) -> float:
    start = time.perf_counter()
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and '"choices":[{' in line:
                return time.perf_counter() - start
    raise RuntimeError("no token came")


ANSWER = (
    b'data: {"choices":[{"delta":{"role":"assistant","content":"ok"},"finish_reason":null,"index":0}],'
    b'"id":"c","object":"chat.completion.chunk"}\n\n'
    b'data: {"choices":[{"delta":{},"finish_reason":"stop","index":0}],"id":"c","object":"chat.completion.chunk"}\n\n'
    b"data: [DONE]\n\n"
)


def relay(engine: str) -> ThreadingHTTPServer:
    """The engine's own questions to the engine; the chat answered at once."""
    client = httpx.Client(timeout=600)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            answer = client.get(engine + self.path)
            self._send(answer.status_code, "application/json", answer.content)

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.path.startswith("/v1/chat/completions"):
                self._send(200, "text/event-stream", ANSWER)
                return
            answer = client.post(engine + self.path, content=body, headers={"content-type": "application/json"})
            self._send(answer.status_code, "application/json", answer.content)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    build = build_llama_server()
    tmp = Path(tempfile.mkdtemp(prefix="tapfix-window-bench-"))
    ctx = args.tokens + 16_384  # past the tiny model's own 65,536, which llama-server would cap `-c` to
    override = ("--override-kv", f"llama.context_length=int:{ctx}")
    server = start_llama_server(build, tiny_model(build), tmp, *override, ctx=ctx)
    proxy = None
    try:
        with httpx.Client(timeout=600) as client:
            turns = 8
            while (tokens := count(client, server.url, conversation(turns))) < args.tokens:
                turns = max(turns + 1, int(turns * args.tokens / tokens) + 1)
            messages = conversation(turns)
            front = relay(server.url)
            proxy = start_proxy(tmp, f"http://127.0.0.1:{front.server_address[1]}", "--engine", "llamacpp")
            base = {"model": "tiny", "stream": True, "temperature": 0}
            # llama.cpp's own name for the budget: no budget tapfix sees, so nothing is counted
            plain_body = base | {"messages": messages, "n_predict": 16_000}
            first_token_s(client, proxy.url, plain_body)  # tapfix has read the window by now
            rows: dict[str, list[float]] = {
                "first turn": [],
                "next turn": [],
                "no count": [],
                "count alone": [],
                "  template": [],
                "  tokenize": [],
            }
            for r in range(args.rounds):
                # a session tapfix hasn't seen (its own first words), then its next turn; a budget the bytes
                # say may not fit, so tapfix counts: the whole prompt, then only the next turn's new part
                session = [{"role": "system", "content": f"Session {r}. " + messages[0]["content"]}, *messages[1:]]
                reply = [{"role": "assistant", "content": "Tests pass."}, {"role": "user", "content": "Commit it."}]
                rows["first turn"].append(
                    first_token_s(client, proxy.url, base | {"messages": session, "max_tokens": 16_000})
                )
                body = base | {"messages": session + reply, "max_tokens": 16_000}
                rows["next turn"].append(first_token_s(client, proxy.url, body))
                rows["no count"].append(first_token_s(client, proxy.url, plain_body))
                start = time.perf_counter()
                prompt = client.post(f"{server.url}/apply-template", json={"messages": messages}).json()["prompt"]
                templated = time.perf_counter()
                client.post(f"{server.url}/tokenize", json={"content": prompt})
                rows["count alone"].append(time.perf_counter() - start)
                rows["  template"].append(templated - start)
                rows["  tokenize"].append(time.perf_counter() - templated)
    finally:
        if proxy is not None:
            proxy.stop()
        server.stop()
    body_kb = len(json.dumps(plain_body)) / 1024
    print(f"prompt: {tokens} tokens by llama-server's count, {body_kb:.0f} KB of request, {args.rounds} rounds")
    print(f"{'row':<12} {'median ms':>10} {'min ms':>8} {'max ms':>8}")
    for name, values in rows.items():
        ms = [v * 1000 for v in values]
        print(f"{name:<12} {statistics.median(ms):>10.1f} {min(ms):>8.1f} {max(ms):>8.1f}")
    added = {
        name: statistics.median(rows[name]) - statistics.median(rows["no count"])
        for name in ("first turn", "next turn")
    }
    for name, seconds in added.items():
        print(f"added TTFT, {name} (median less the median without a count): {seconds * 1000:.1f} ms")
    if args.json:
        args.json.write_text(json.dumps({"tokens": tokens, "rows": rows, "added_s": added}, indent=1))


if __name__ == "__main__":
    main()
