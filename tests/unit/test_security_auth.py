"""Who can get in: loopback by default; beyond loopback only with the tapfix token, given as the client's
API key, checked in constant time, stripped, and never forwarded (the upstream gets its own key).

Here `addons/auth.py` directly; the real proxy in tests/inproc/test_security_auth.py, the refusal to start
in tests/process/test_security_auth.py.
"""

from __future__ import annotations

import base64
import json

import pytest
from mitmproxy.test import tflow
from tapfix.addons.auth import TokenAuth
from tapfix.addons.runner.master import build_runtime
from tapfix.proxy.config.settings import Settings

TOKEN = "tapfix-token-0123456789abcdef"


def _auth(intercept: set[str] | None = None) -> TokenAuth:
    runtime = build_runtime(Settings(upstream="http://127.0.0.1:9"))
    runtime.intercept_hosts = intercept or set()
    return TokenAuth(runtime, TOKEN)


def _flow(**headers: str):
    flow = tflow.tflow()
    flow.request.headers.clear()
    for name, value in headers.items():
        flow.request.headers[name.replace("_", "-")] = value
    return flow


@pytest.mark.parametrize(
    "headers",
    [
        {"authorization": f"Bearer {TOKEN}"},
        {"authorization": f"bearer  {TOKEN} "},
        {"x_api_key": TOKEN},
        {"api_key": TOKEN},
    ],
)
def test_the_token_as_api_key_is_accepted_and_stripped(headers):
    flow = _flow(**headers, user_agent="opencode")
    _auth().requestheaders(flow)
    assert flow.response is None
    assert dict(flow.request.headers) == {"user-agent": "opencode"}  # the token never goes upstream


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer wrong-token-0123456789abcd"},
        {"authorization": TOKEN},
        {"authorization": f"Basic {TOKEN}"},
        {"x_api_key": TOKEN[:-1]},
        {"x_api_key": TOKEN + "x"},
        {"authorization": "Bearer "},
        {"x_api_key": ""},
    ],
)
def test_anything_else_gets_openai_shaped_401(headers):
    flow = _flow(**headers)
    auth = _auth()
    auth.requestheaders(flow)
    assert flow.response is not None and flow.response.status_code == 401
    error = json.loads(flow.response.content)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_api_key"
    assert TOKEN not in flow.response.text and auth.rejected == 1


def test_short_tokens_are_refused():
    runtime = build_runtime(Settings(upstream="http://127.0.0.1:9"))
    with pytest.raises(ValueError):
        TokenAuth(runtime, "short")


def test_connect_needs_the_token_unless_the_host_is_intercepted():
    auth = _auth(intercept={"api.example.com"})
    flow = _flow()
    flow.request.host = "elsewhere.example.org"
    auth.http_connect(flow)
    assert flow.response is not None and flow.response.status_code == 407  # never an open relay
    for value in (f"Bearer {TOKEN}", "Basic " + base64.b64encode(f"user:{TOKEN}".encode()).decode()):
        ok = _flow(proxy_authorization=value)
        ok.request.host = "elsewhere.example.org"
        auth.http_connect(ok)
        assert ok.response is None and "proxy-authorization" not in ok.request.headers
    inside = _flow()
    inside.request.host = "api.example.com"
    auth.http_connect(inside)
    assert inside.response is None  # its requests are checked one by one by `request`
