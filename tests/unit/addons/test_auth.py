"""TokenAuth in-process: it decides in `requestheaders`, before the body is read, and a rejected flow
is left alone by every later addon (never forwarded, never recorded)."""

from __future__ import annotations

import asyncio

import orjson
from mitmproxy.test import taddons
from tapfix.addons.auth import TokenAuth
from tapfix.addons.health import Health
from tapfix.addons.recorder import RecordRequest
from tapfix.addons.runner.runtime import META

from tests.support.flows import flow, json_response, runtime

TOKEN = "tapfix-token-0123456789abcdef"


def test_a_missing_token_is_answered_at_requestheaders_with_the_401_agents_stop_on() -> None:
    auth = TokenAuth(runtime(), TOKEN)
    f = flow(body={"model": "m"})
    with taddons.context(auth):
        auth.requestheaders(f)
    assert f.response is not None and f.response.status_code == 401
    assert f.response.headers["www-authenticate"] == 'Bearer realm="tapfix"'
    assert f.response.headers["content-type"] == "application/json"
    error = orjson.loads(f.response.content)["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")


def test_a_rejected_flow_is_neither_recorded_nor_answered_by_health() -> None:
    rt = runtime()
    chain = [TokenAuth(rt, TOKEN), Health(rt), RecordRequest(rt)]
    f = flow("/tapfix/health", method="GET")

    async def run() -> None:
        with taddons.context(*chain) as tctx:
            for addon in chain:
                await tctx.cycle(addon, f)

    asyncio.run(run())
    assert f.response is not None and f.response.status_code == 401  # not health's 200
    assert META not in f.metadata and rt.exchanges_seen == 0


def test_the_token_is_stripped_before_the_recorder_keeps_the_headers() -> None:
    rt = runtime()
    auth, recorder = TokenAuth(rt, TOKEN), RecordRequest(rt)
    f = flow(body={"model": "m"}, headers={"authorization": f"Bearer {TOKEN}"})
    with taddons.context(auth, recorder):
        auth.requestheaders(f)
        recorder.request(f)
    assert f.response is None and "authorization" not in f.request.headers
    assert all(name != "authorization" for name, _ in f.metadata[META].request_headers)


def test_guard_clauses_leave_answered_failed_and_dead_flows_alone() -> None:
    auth = TokenAuth(runtime(), TOKEN)
    answered = flow(response=json_response({"ok": True}))
    dead = flow()
    dead.live = False
    with taddons.context(auth):
        for f in (answered, dead):
            auth.requestheaders(f)
    assert answered.response is not None and answered.response.status_code == 200
    assert dead.response is None and auth.rejected == 0
