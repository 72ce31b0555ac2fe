"""What the in-process addon tests share: a runtime as `tapfix run` builds it, and flows to feed it.

No process, no socket: the addons run inside `mitmproxy.test.taddons.context`, on flows from
`mitmproxy.test.tflow`, with the runtime `addons/runner/master.build_runtime` builds for `tapfix run`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
from mitmproxy import http
from mitmproxy.test import taddons, tflow, tutils
from tapfix.addons.runner.master import build_runtime
from tapfix.addons.runner.runtime import META, Runtime
from tapfix.proxy.config.file import from_dict
from tapfix.proxy.config.settings import Settings
from tapfix.proxy.config.upstream import UpstreamTarget
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.request.policy import RequestPolicy
from tapfix.proxy.store.writer import CaptureWriter

from tests.support.builders import tool

UPSTREAM = "http://127.0.0.1:9/v1"  # never dialled: the tests mark it reachable or stop before
CHAT = "/v1/chat/completions"
READ_TOOL = tool("read", {"path": {"type": "string"}}, ["path"])


def runtime(*, writer: CaptureWriter | None = None, config: dict[str, Any] | None = None, **settings: Any) -> Runtime:
    """Quick mode on UPSTREAM by default; `config` gives a config-file policy with its upstreams."""
    if config is None:
        return build_runtime(Settings(upstream=UPSTREAM, **settings), writer=writer)
    cfg = from_dict(config)
    targets = {name: UpstreamTarget.parse(u.base_url, name) for name, u in cfg.upstreams.items()}
    return build_runtime(Settings(**settings), policy=RequestPolicy(cfg, environ={}), targets=targets, writer=writer)


def reachable(rt: Runtime) -> Runtime:
    """Every upstream counts as just seen, so the router never opens a connection to check."""
    for name in rt.targets:
        rt.saw_upstream(name)
    return rt


def flow(
    path: str = CHAT,
    body: object = None,
    *,
    method: str = "POST",
    headers: dict[str, str] | None = None,
    response: http.Response | None = None,
) -> http.HTTPFlow:
    """A live flow as a client sent it (127.0.0.1:8080); `body` dicts are sent as JSON."""
    content = orjson.dumps(body) if isinstance(body, dict) else (body or b"")
    fields = [
        (b"host", b"127.0.0.1:8080"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(content)).encode()),
    ]
    fields += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    request = tutils.treq(
        host="127.0.0.1",
        port=8080,
        method=method.encode(),
        path=path.encode(),
        headers=http.Headers(fields),
        content=content,
    )
    return tflow.tflow(req=request, resp=response or False)


def recorded(f: http.HTTPFlow, **fields: Any) -> Exchange:
    """Attach the exchange the recorder would have made for this flow."""
    request = f.request
    ex = Exchange(method=request.method, path=request.path, request=request.raw_content or b"", **fields)
    f.metadata[META] = ex
    return ex


def sse_response(*events: bytes, status: int = 200, length: bool = True) -> http.Response:
    body = b"".join(events)
    fields = [(b"content-type", b"text/event-stream")]
    if length:
        fields.append((b"content-length", str(len(body)).encode()))
    return tutils.tresp(status_code=status, headers=http.Headers(fields), content=body)


def json_response(obj: object, status: int = 200) -> http.Response:
    body = orjson.dumps(obj)
    fields = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return tutils.tresp(status_code=status, headers=http.Headers(fields), content=body)


def store(tmp_path: Path) -> CaptureWriter:
    return CaptureWriter(tmp_path / "captures.db")


def requested(addon: Any, f: http.HTTPFlow) -> None:
    """An addon's `request` hook run on `f` as mitmproxy runs it (in its loop, inside the addon's context)."""

    async def run() -> None:
        with taddons.context(addon):
            await addon.request(f)

    asyncio.run(run())


def assert_leaves_alone(addon: Any, other_path: str, own_path: str) -> None:
    """An addon answering GET `own_path` leaves a request to `other_path`, and one already answered, as they are."""
    other = flow(other_path, method="GET")
    answered = flow(own_path, method="GET", response=json_response({"mine": True}, 401))
    for f in (other, answered):
        requested(addon, f)
    assert other.response is None
    assert answered.response is not None and answered.response.status_code == 401
