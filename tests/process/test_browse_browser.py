"""A real `tapfix browse` process, loaded by headless Chromium over loopback.

Chromium's `--dump-dom` prints the DOM after the page loaded and its scripts ran, so it shows both
what a user sees and any side effect a stored XSS payload would have had: the payloads set
`document.title` and a `data-pwned` attribute; neither may happen, while our own script (served
from /static under the CSP) must run and mark `<html data-js="ready">`.
CI installs Chromium (`apt-get install -y chromium`); without it these tests skip, saying why.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.chromium import CHROMIUM, FLAGS
from tests.support.ci import unavailable
from tests.support.procs import free_port, wait_port
from tests.unit.test_browse_fixtures import Built, build_db

pytestmark = [pytest.mark.browser]


def _no_chromium() -> None:
    unavailable("chromium is not installed (apt-get install -y chromium); .ci/run installs it")


@dataclass
class Browse:
    url: str
    built: Built
    proc: subprocess.Popen[bytes]


def chromium(args: list[str], user_data: Path, timeout: float = 90.0) -> str:
    if CHROMIUM is None:
        _no_chromium()
    result = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={user_data}", *args],
        capture_output=True,
        timeout=timeout,
        start_new_session=True,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    return result.stdout.decode(errors="replace")


@pytest.fixture(scope="module")
def browse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browse]:
    if CHROMIUM is None:
        _no_chromium()
    tmp = tmp_path_factory.mktemp("browser")
    built = build_db(tmp / "captures.db")
    port = free_port()
    log = open(tmp / "browse.log", "wb")
    env = {**os.environ, "TAPFIX_BROWSE_TOKEN": ""}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tapfix.proxy.cli.browse",
            "--db",
            str(built.path),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        wait_port(port, proc)
        yield Browse(f"http://127.0.0.1:{port}", built, proc)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        log.close()


def dump(browse: Browse, path: str, tmp_path: Path) -> str:
    return chromium(["--dump-dom", "--virtual-time-budget=3000", browse.url + path], tmp_path / "profile")


def _no_side_effects(dom: str) -> None:
    assert 'data-js="ready"' in dom, "our /static script did not run: the check below would prove nothing"
    assert "pwned" not in (re.search(r"<title>(.*?)</title>", dom, re.S) or [""])[0]
    body = re.search(r"<body[^>]*>", dom)
    assert body is not None and "data-pwned" not in body.group(0)


def test_list_page(browse: Browse, tmp_path: Path) -> None:
    dom = dump(browse, "/", tmp_path)
    assert "<title>captures · tapfix browse</title>" in dom
    for capture_id in browse.built.ids.values():
        assert f'href="/exchange/{capture_id}"' in dom
    _no_side_effects(dom)
    dom = dump(browse, "/?q=tokenizer", tmp_path)
    assert "<mark>tokenizer</mark>" in dom


def test_exchange_page(browse: Browse, tmp_path: Path) -> None:
    capture_id = browse.built.ids["turn2"]
    dom = dump(browse, f"/exchange/{capture_id}", tmp_path)
    assert f"<title>{capture_id} · tapfix browse</title>" in dom
    assert "repaired tool calls" in dom and "two JSON objects glued together" in dom
    assert '<svg class="timeline"' in dom and f"tapfix replay {capture_id}" in dom
    _no_side_effects(dom)


def test_stats_page(browse: Browse, tmp_path: Path) -> None:
    dom = dump(browse, "/stats", tmp_path)
    assert "requests per client and model" in dom and '<svg class="histogram"' in dom
    assert "concatenated_json" in dom
    _no_side_effects(dom)


def test_stored_xss_never_executes(browse: Browse, tmp_path: Path) -> None:
    capture_id = browse.built.ids["xss"]
    for path in (f"/exchange/{capture_id}", "/", "/?q=payload", "/sessions", "/stats"):
        dom = dump(browse, path, tmp_path)
        _no_side_effects(dom)
        assert "<script>document" not in dom and "<img src=" not in dom, path
    dom = dump(browse, f"/exchange/{capture_id}", tmp_path)
    assert f"<title>{capture_id} · tapfix browse</title>" in dom
    assert "answer &lt;script&gt;document.title='pwned'&lt;/script&gt;&lt;img src=x onerror=" in dom


def test_screenshot(browse: Browse, tmp_path: Path) -> None:
    out = tmp_path / "exchange.png"
    chromium(
        [
            f"--screenshot={out}",
            "--window-size=1280,1800",
            browse.url + f"/exchange/{browse.built.ids['turn1']}",
        ],
        tmp_path / "profile",
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000


def test_the_payloads_would_run_on_a_naive_page(tmp_path: Path) -> None:
    """The detector itself: the same payloads, pasted raw into a page, do change the title and body."""
    from tests.unit.test_browse_fixtures import XSS

    page = tmp_path / "naive.html"
    page.write_text(f"<!doctype html><html><head><title>naive</title></head><body><p>{XSS}</p></body></html>")
    dom = chromium(["--dump-dom", "--virtual-time-budget=3000", page.as_uri()], tmp_path / "profile")
    assert "<title>pwned</title>" in dom
    body = re.search(r"<body[^>]*>", dom)
    assert body is not None and 'data-pwned="1"' in body.group(0)
