"""Window: an engine's overflow error becomes the surface's standard one (the stream stage is armed by the
stream owner, addons/stream.py). The logic is in `tapfix.proxy.window`."""

from __future__ import annotations

from mitmproxy import http
from tapfix.addons.runner.runtime import Runtime, exchange_of
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses
from tapfix.proxy.surfaces import surface_for
from tapfix.proxy.window.rewrite import FLAG, rewrite_body


class Window:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def response(self, flow: http.HTTPFlow) -> None:
        """A whole error body (vLLM, SGLang, llama.cpp, Ollama and TabbyAPI answer an overflow with a 400
        before any stream starts): the standard overflow error replaces it for the client."""
        ex = exchange_of(flow)
        response = flow.response
        if ex is None or response is None or response.stream or ex.tapfix_answered or response.status_code < 400:
            return
        surface = surface_for(ex.path)
        if surface is None:
            return
        body = ex.decoded_response if ex.decoded_response is not None else (response.raw_content or b"")
        hints = ex.extra.get("window_hints", (None, None))
        rewritten = rewrite_body(surface, body, *hints)
        if rewritten is None:
            return
        answer, change = rewritten
        response.status_code = answer.status
        response.headers.pop("content-encoding", None)
        response.headers["content-type"] = "application/json"
        response.raw_content = answer.body
        if "content-length" in response.headers:
            response.headers["content-length"] = str(len(answer.body))
        ex.client_response = answer.body
        ex.changes.append(change)
        ex.flags.add(FLAG)
