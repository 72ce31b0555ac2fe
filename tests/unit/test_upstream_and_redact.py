from __future__ import annotations

import pytest
from tapfix.proxy.config.upstream import UpstreamTarget, UpstreamURLError, authority
from tapfix.proxy.store.redact import redact_header, redact_url


@pytest.mark.parametrize(
    ("root", "path", "joined"),
    [
        ("http://h:1", "/v1/chat/completions", "/v1/chat/completions"),
        ("http://h:1/v1", "/v1/models", "/v1/models"),
        ("http://h:1/v1/", "/v1", "/v1"),
        ("https://h/api", "/v1/x?a=1", "/api/v1/x?a=1"),
        ("http://h:1/openai/v1", "/health", "/openai/v1/health"),
    ],
)
def test_join_never_doubles_v1(root, path, joined):
    assert UpstreamTarget.parse(root).join(path) == joined


@pytest.mark.parametrize("bad", ["127.0.0.1:8000", "ftp://h", "http://", "http://h:99999", "http://h/?q=1"])
def test_bad_upstream_urls_are_clear(bad):
    with pytest.raises(UpstreamURLError):
        UpstreamTarget.parse(bad)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("Authorization", "Bearer abc"),
        ("x-api-key", "k"),
        ("Cookie", "a=b"),
        ("X-My-Token", "t"),
        ("api-key", "x"),
        ("Proxy-Authorization", "Basic x"),
    ],
)
def test_secret_headers_are_redacted(name, value):
    assert redact_header(name, value) == "[redacted]"


def test_keylike_values_and_url_params_are_redacted():
    assert "sk-abcdefghijklmnopqrst" not in redact_header("x-note", "sk-abcdefghijklmnopqrst")
    assert redact_header("x-session-id", "ses_123") == "ses_123"
    assert redact_url("/v1/x?key=SECRET&model=m&api_key=S2") == "/v1/x?key=[redacted]&model=m&api_key=[redacted]"


@pytest.mark.parametrize(
    ("host", "port", "scheme", "written"),
    [
        ("127.0.0.1", 8080, "http", "127.0.0.1:8080"),
        ("::1", 8080, "http", "[::1]:8080"),
        ("[::1]", 8080, "http", "[::1]:8080"),
        ("::1", 80, "http", "[::1]"),
        ("fe80::1", 443, "https", "[fe80::1]"),
        ("example.com", 443, "http", "example.com:443"),
        ("::1", None, None, "[::1]"),
    ],
)
def test_authority_brackets_ipv6_and_drops_the_default_port(host, port, scheme, written):
    assert authority(host, port, scheme) == written


def test_an_ipv6_upstream_parses_and_writes_back_bracketed():
    target = UpstreamTarget.parse("http://[::1]:8000/v1")
    assert (target.host, target.port, target.prefix) == ("::1", 8000, "/v1")
    assert target.authority == "[::1]:8000"
    assert target.origin == "http://[::1]:8000"
    assert UpstreamTarget.parse("https://[::1]/v1").authority == "[::1]"


def test_an_unbracketed_ipv6_upstream_is_refused_with_the_fix():
    with pytest.raises(UpstreamURLError, match="bracket"):
        UpstreamTarget.parse("http://::1:8000/v1")
