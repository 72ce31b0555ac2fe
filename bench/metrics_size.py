"""How big a `/tapfix/metrics` scrape is after mixed traffic, plain and as Prometheus fetches it (gzip).

Why: the QA pass found a 608 KB scrape after ~70 exchanges. The text format repeats every label on
every histogram bucket line, so the size grows with the series (models x upstreams x surfaces x error
types) far more than with the traffic. A real `tapfix run` in front of `tapfix mock` gets EXCHANGES
requests spread over MODELS model names and three surfaces (chat streamed with usage and not, Messages,
Responses), then is scraped twice: `Accept-Encoding: identity` and `gzip` (what Prometheus sends), and
the bytes on the wire are counted. CPU to render and compress one scrape is the proxy's own (procstat).

    .venv/bin/python bench/metrics_size.py [--tapfix PATH] [--exchanges 70] [--models 25] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procstat import cpu_ns, wait_idle  # noqa: E402
from startup import ROOT, _free_port, _wait_port  # noqa: E402

PROMPT = [{"role": "user", "content": "Count to 5"}]


def _traffic(client: httpx.Client, exchanges: int, models: int) -> None:
    for i in range(exchanges):
        model = f"model-{i % models}"
        kind = i % 4
        if kind == 0:
            body = {"model": model, "messages": PROMPT, "stream": True, "stream_options": {"include_usage": True}}
            r = client.post("/v1/chat/completions", json=body)
        elif kind == 1:
            r = client.post("/v1/chat/completions", json={"model": model, "messages": PROMPT})
        elif kind == 2:
            r = client.post("/v1/messages", json={"model": model, "max_tokens": 64, "messages": PROMPT, "stream": True})
        else:
            r = client.post("/v1/responses", json={"model": model, "input": "Count to 5"})
        r.raise_for_status()


def _scrape(url: str, encoding: str) -> tuple[int, int]:
    """(bytes on the wire, bytes of text) for one scrape."""
    with httpx.stream("GET", url, headers={"accept-encoding": encoding}, timeout=30) as r:
        wire = b"".join(r.iter_raw())
        text = wire
        if r.headers.get("content-encoding") == "gzip":
            import gzip

            text = gzip.decompress(wire)
    return len(wire), len(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tapfix", default=str(ROOT / ".venv" / "bin" / "tapfix"))
    ap.add_argument("--exchanges", type=int, default=70)
    ap.add_argument("--models", type=int, default=25)
    ap.add_argument("--json")
    args = ap.parse_args()
    mock_port, port = _free_port(), _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        mock = subprocess.Popen([args.tapfix, "mock", "--listen", f"127.0.0.1:{mock_port}"], stdout=subprocess.DEVNULL)
        proxy = None
        try:
            _wait_port(mock_port, mock)
            argv = [args.tapfix, "run", "--upstream", f"http://127.0.0.1:{mock_port}", "--listen", f"127.0.0.1:{port}"]
            proxy = subprocess.Popen(
                [*argv, "--db", f"{tmp}/c.db"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            _wait_port(port, proxy)
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                _traffic(client, args.exchanges, args.models)
            time.sleep(1.5)  # the writer commits (and records the metrics) within a second
            wait_idle({"proxy": proxy.pid})
            url = f"http://127.0.0.1:{port}/tapfix/metrics"
            out: dict[str, float] = {}
            for encoding in ("identity", "gzip"):
                before = cpu_ns(proxy.pid)
                wire, text = _scrape(url, encoding)
                wait_idle({"proxy": proxy.pid})
                out[f"{encoding}_wire_kb"] = wire / 1024
                out[f"{encoding}_text_kb"] = text / 1024
                out[f"{encoding}_cpu_ms"] = (cpu_ns(proxy.pid) - before) / 1e6
        finally:
            for p in (proxy, mock):
                if p is not None:
                    p.terminate()
                    p.wait(15)
    print(f"{args.exchanges} exchanges over {args.models} models: " + "  ".join(f"{k}={v:.1f}" for k, v in out.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
