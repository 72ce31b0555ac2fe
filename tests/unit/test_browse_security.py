"""Captured text is never markup; the browser answers only whom it should (Host, token, CLI refusal)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient
from tapfix.proxy.browse import create_app
from tapfix.proxy.browse.security import COOKIE
from tapfix.proxy.cli.browse import browse

from tests.unit.test_browse_fixtures import XSS, Built, build_db


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build_db(tmp_path_factory.mktemp("sec") / "captures.db")


@pytest.fixture(scope="module")
def client(built: Built) -> Iterator[TestClient]:
    with TestClient(create_app(built.path, background_index=False), base_url="http://127.0.0.1") as c:
        yield c


def _no_live_markup(html: str) -> None:
    assert "<script>document" not in html and "<img src=x" not in html and 'onerror="document' not in html
    scripts = re.findall(r"<script[^>]*>", html)
    assert scripts == ['<script src="/static/browse.js" defer>'], scripts


@pytest.mark.parametrize("url", ["/", "/?q=payload", "/?flag=xss_flag", "/stats", "/sessions", "/?client=evil-agent"])
def test_xss_payloads_render_as_text_on_lists(client: TestClient, url: str) -> None:
    html = client.get(url).text
    _no_live_markup(html)


def test_xss_payloads_render_as_text_on_the_exchange_page(client: TestClient, built: Built) -> None:
    html = client.get(f"/exchange/{built.ids['xss']}").text
    _no_live_markup(html)
    escaped = "&lt;script&gt;document.title=&#39;pwned&#39;&lt;/script&gt;"
    assert html.count(escaped) >= 6  # client, request body, reasoning, content, tool name, change, header
    assert "answer &lt;script&gt;" in html and "thinking &lt;script&gt;" in html


def test_xss_in_the_session_page(client: TestClient, built: Built) -> None:
    import sqlite3

    sid = (
        sqlite3.connect(built.path)
        .execute("select session_id from exchanges where id = ?", (built.ids["xss"],))
        .fetchone()[0]
    )
    html = client.get(f"/session/{sid}").text
    _no_live_markup(html)
    assert "payload &lt;script&gt;" in html


def test_csp_forbids_inline_code(client: TestClient) -> None:
    csp = client.get("/").headers["content-security-policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert directives["frame-ancestors"] == "'none'"


def test_downloads_never_render(client: TestClient, built: Built) -> None:
    r = client.get(f"/exchange/{built.ids['xss']}/body/request")
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.headers["content-disposition"].startswith("attachment")
    assert XSS.encode() in r.content.replace(b'\\"', b'"')  # exact bytes, unescaped: hence the attachment


@pytest.mark.parametrize("host", ["evil.example", "attacker.test:8081", "192.168.1.10"])
def test_loopback_mode_refuses_foreign_host_headers(client: TestClient, host: str) -> None:
    r = client.get("/", headers={"host": host})
    assert r.status_code == 421
    assert "content-security-policy" in r.headers


@pytest.mark.parametrize("host", ["127.0.0.1:8081", "localhost:8081", "[::1]:8081", "localhost"])
def test_loopback_mode_accepts_loopback_host_headers(client: TestClient, host: str) -> None:
    assert client.get("/", headers={"host": host}).status_code == 200


def test_token_gate(built: Built) -> None:
    app = create_app(built.path, token="s3cret", loopback_only=False, background_index=False)
    with TestClient(app, base_url="http://10.0.0.5:8081") as c:
        r = c.get("/", follow_redirects=False)
        assert r.status_code == 401 and "content-security-policy" in r.headers
        assert c.get("/", params={"token": "wrong"}, follow_redirects=False).status_code == 401
        assert c.get("/", headers={"authorization": "Bearer wrong"}).status_code == 401
        assert c.get("/", headers={"authorization": "Bearer s3cret"}).status_code == 200
        r = c.get("/stats?token=s3cret&model=qwen3", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/stats?model=qwen3"
        set_cookie = r.headers["set-cookie"]
        assert "httponly" in set_cookie.lower() and "samesite=strict" in set_cookie.lower()
        assert "s3cret" not in set_cookie  # the cookie is derived from the token, not the token
        assert c.get("/stats?model=qwen3").status_code == 200  # the cookie now
        c.cookies.clear()
        assert c.get("/stats").status_code == 401
        c.cookies.set(COOKIE, "forged")
        assert c.get("/stats").status_code == 401


def test_token_redirect_is_never_off_site(built: Built) -> None:
    app = create_app(built.path, token="s3cret", loopback_only=False, background_index=False)
    with TestClient(app, base_url="http://10.0.0.5:8081") as c:
        r = c.get("//evil.example/x?token=s3cret", follow_redirects=False)
        assert r.headers["location"].startswith("/") and not r.headers["location"].startswith("//")


def test_non_loopback_app_without_token_is_refused(built: Built) -> None:
    with pytest.raises(ValueError):
        create_app(built.path, loopback_only=False)


def test_host_headers_are_judged_without_resolving() -> None:
    """HostGuard's rule: a rebound DNS name resolving to 127.0.0.1 is the attack, so names don't count."""
    from tapfix.proxy.net import is_loopback

    assert all(is_loopback(h, resolve=False) for h in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"))
    assert not any(
        is_loopback(h, resolve=False) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com", "", "127.0.0.1.nip.io")
    )


def test_cli_refuses_non_loopback_without_token(built: Built, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TAPFIX_BROWSE_TOKEN", raising=False)
    result = CliRunner().invoke(browse, ["--db", str(built.path), "--listen", "0.0.0.0:8081"])
    assert result.exit_code != 0 and "--token" in result.output
    result = CliRunner().invoke(browse, ["--db", str(built.path), "--listen", "192.168.7.7:8081"])
    assert result.exit_code != 0 and "TAPFIX_BROWSE_TOKEN" in result.output


def test_cli_missing_db_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(browse, ["--db", str(tmp_path / "none.db")])
    assert result.exit_code != 0 and "no capture database" in result.output


def test_cli_bad_listen(built: Built) -> None:
    result = CliRunner().invoke(browse, ["--db", str(built.path), "--listen", "127.0.0.1:http"])
    assert result.exit_code == 2


def test_cli_help_documents_the_command() -> None:
    result = CliRunner().invoke(browse, ["--help"])
    assert result.exit_code == 0 and "Browse captures" in result.output and "--token" in result.output


def test_sidecar_index_is_private(built: Built) -> None:
    index = Path(str(built.path) + ".fts.sqlite")
    assert index.exists() and index.stat().st_mode & 0o077 == 0


def test_cli_unwritable_index_is_a_clear_error(built: Built, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = CliRunner().invoke(browse, ["--db", str(built.path), "--index", str(blocker / "idx.sqlite")])
    assert result.exit_code != 0 and "--no-search" in result.output
