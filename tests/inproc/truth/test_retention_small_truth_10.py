"""Issue 15 item 10, four of the smaller ones, each through the real part it is about, in the test process:
`replay --set` into an array or a scalar, a NUL in browse's search (its app), `probe --config` and a missing
key variable, and the mock on a prompt that is one long word. `run --strict` in quick mode refusing to
start: tests/process/truth/test_retention_small_truth_10.py.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient
from tapfix.proxy.browse import create_app

from tests.inproc.test_e2e_regenerate import all_exchanges
from tests.support.inproc import InprocMock, InprocProxy, cli, start_mock
from tests.support.procs import wait_capture

MISSING_KEY = "TAPFIX_TRUTH_10_MISSING_KEY"


def _settled(db: Path, want: int, timeout: float = 10.0) -> int:
    """The exchange count once it reaches `want` (or whatever it is after `timeout`)."""
    deadline = time.monotonic() + timeout
    while (n := all_exchanges(db)) < want and time.monotonic() < deadline:
        time.sleep(0.05)
    return n


def test_truth_10_replay_set_refuses_array_and_scalar(proxy: InprocProxy, mock: InprocMock) -> None:
    """`--set` walks into objects only: an array or a scalar on the way is refused, naming both, and
    nothing is sent (the replay goes through the proxy, so a sent request would be captured there)."""
    db = proxy.extra["db"]
    body = {
        "model": "tapfix-mock",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Say hello"}],
    }
    response = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 200
    capture_id = response.headers["x-tapfix-capture-id"]
    wait_capture(db, capture_id)
    before = all_exchanges(db)
    for args, key, found in (
        (("--set", "messages.0.content=hi"), "messages", "array"),
        (("--set", "messages.1=7"), "messages", "array"),
        (("--set", "model.x=1"), "model", "string"),
        (("--set", "temperature=1", "--set", "temperature.deep.er=2"), "temperature", "number"),
        (("--unset", "messages.0"), "messages", "array"),
    ):
        result = cli("replay", capture_id, "--db", str(db), "--upstream", proxy.url, *args)
        err = result.stderr.decode()
        assert result.returncode == 2, (args, result.stdout, err)
        assert f"'{key}'" in err and found in err, (args, err)
        assert all_exchanges(db) == before, f"{args}: something was sent"

    # Walking into objects still works, creating them where missing: sent once, through the proxy.
    ok = cli("replay", capture_id, "--db", str(db), "--upstream", proxy.url, "--set", "chat_template_kwargs.x=1")
    assert ok.returncode == 0, ok.stderr.decode()
    assert _settled(db, before + 2) == before + 2  # the proxy's capture and the replay's own


def test_truth_10_browse_search_with_nul(proxy: InprocProxy) -> None:
    """A NUL in `?q=` separates words like a space: a search, not an HTTP 500."""
    db = proxy.extra["db"]
    body = {"model": "tapfix-mock", "messages": [{"role": "user", "content": "zebracorn quasarfish"}]}
    response = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=30)
    capture_id = response.headers["x-tapfix-capture-id"]
    wait_capture(db, capture_id)
    with TestClient(create_app(db), base_url="http://127.0.0.1") as client:  # `tapfix browse`'s app
        deadline = time.monotonic() + 20
        while capture_id not in client.get("/", params={"q": "zebracorn"}).text:  # the index catches up
            assert time.monotonic() < deadline, "the search index never listed the capture"
            time.sleep(0.2)
        for q, found in (("zebracorn\x00quasarfish", True), ("\x00zebracorn", True), ("zebra\x00", False)):
            r = client.get("/", params={"q": q})  # a server error would raise here, with its traceback
            assert r.status_code == 200, (q, r.status_code, r.text[:300])
            assert (capture_id in r.text) is found, q


def test_truth_10_probe_config_reports_missing_key(mock: InprocMock, tmp_path: Path) -> None:
    """`probe --config` reports an unset key variable exactly as `check` does, and fails for it."""
    config = tmp_path / "tapfix.toml"
    config.write_text(f"""
[upstreams.gpu0]
base_url = "{mock.url}/v1"
engine = "vllm"
api_key_env = "{MISSING_KEY}"
[models.mock]
upstream = "gpu0"
upstream_model = "tapfix-mock"
""")
    line = f"error: upstreams.gpu0.api_key_env: environment variable {MISSING_KEY} is not set"
    unset: dict[str, str | None] = {MISSING_KEY: None}
    checked = cli("check", "--config", str(config), env=unset)
    assert checked.returncode == 1 and line in checked.stdout.decode(), checked.stdout
    probed = cli("probe", "--config", str(config), "--no-capture", "--only", "models,completion", env=unset)
    out = probed.stdout.decode()
    assert probed.returncode == 1, out + probed.stderr.decode()
    assert line in " ".join(re.sub("[│┃]", " ", out).split()), out  # the table may wrap the detail
    as_json = cli("probe", "--config", str(config), "--no-capture", "--only", "completion", "--json", env=unset)
    report = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and report["ok"] is False
    failed = [r for r in report["results"] if r["status"] == "fail"]
    assert [r["detail"] for r in failed] == [line], report
    # With the variable set, nothing is reported (the mock takes any key).
    fine = cli(
        "probe", "--config", str(config), "--no-capture", "--only", "completion", "--json", env={MISSING_KEY: "k-123"}
    )
    assert fine.returncode == 0, fine.stdout


@pytest.mark.parametrize("letter", ["a", "7"])
def test_truth_10_mock_long_word_does_not_block(tmp_path: Path, letter: str) -> None:
    """A 6 MB one-word prompt must not stall the mock: small requests sent while it is in flight are
    answered (each within a generous 20 s), and the big one is answered too. Before the fix the mock
    cut long words quadratically (and one regex scanned digit runs quadratically) on its event loop."""
    mock = start_mock(tmp_path)
    word = letter * 6_000_000
    done = threading.Event()
    big: dict[str, object] = {}

    def send_big() -> None:
        try:
            body = {"model": "tapfix-mock", "messages": [{"role": "user", "content": word}]}
            r = httpx.post(f"{mock.url}/v1/chat/completions", json=body, timeout=600)
            big["status"], big["content"] = r.status_code, r.json()["choices"][0]["message"]["content"]
        except Exception as e:  # noqa: BLE001 - reported by the assertions below
            big["error"] = repr(e)
        finally:
            done.set()

    thread = threading.Thread(target=send_big, daemon=True)
    try:
        thread.start()
        small = {"model": "tapfix-mock", "messages": [{"role": "user", "content": "Say hello"}]}
        answered = 0
        with httpx.Client(base_url=mock.url, timeout=20) as client:
            while not done.is_set() and answered < 2000:
                try:
                    r = client.post("/v1/chat/completions", json=small)
                except httpx.TimeoutException:
                    pytest.fail(f"a small request waited 20 s behind the long word ({answered} answered before it)")
                assert r.status_code == 200
                answered += 1
                # Paced: one small request at a time is what shows the loop free; a busy loop of them only
                # burned the CPU the mock needs for the big one (4 s of CPU a run).
                done.wait(0.02)
        thread.join(120)
        assert done.is_set(), "the long-word request never finished"
        assert big.get("status") == 200, big.get("error")
        assert word in str(big["content"])
    finally:
        mock.stop()
