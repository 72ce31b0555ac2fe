"""`tapfix probe` end to end: the real mock over loopback (in the test process), exit codes, JSON, captures, config."""

from __future__ import annotations

import asyncio
import json
import subprocess

import pytest
from tapfix.proxy.probe import ALL_CHECKS, ProbeReport, run_probe

from tests.support.config_text import toml_table
from tests.support.inproc import cli, start_mock
from tests.support.procs import free_port


def probe(*args: str) -> subprocess.CompletedProcess:
    """`tapfix probe ...`, the registered command."""
    return cli("probe", *args)


def report_of(result: subprocess.CompletedProcess) -> dict:
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def healthy(module_tmp):
    proc = start_mock(module_tmp, "--chunk-delay-ms", "2")
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def wrong_ids(module_tmp):
    proc = start_mock(module_tmp, "--scenario", "wrong_model_ids")
    yield proc
    proc.stop()


def test_healthy_server_exit_0_table_and_captures(healthy, tmp_path):
    db = tmp_path / "probe.db"
    result = probe("--upstream", healthy.url, "--db", str(db))
    out = result.stdout.decode()
    assert result.returncode == 0, out + result.stderr.decode()
    for check in ALL_CHECKS:
        assert check in out
    assert "8 passed, 0 failed, 0 skipped" in out
    listed = cli("captures", "list", "--db", str(db), "--tag", "probe", "--json", "--limit", "0")
    assert listed.returncode == 0, listed.stderr
    captures = [json.loads(line) for line in listed.stdout.splitlines()]
    # models 1, completion 1, streaming 1, tools 2, reasoning 2, vision 1, long_context 1
    assert len(captures) == 9
    assert all("probe" in c["tags"] and c["user_agent"].startswith("tapfix-probe/") for c in captures)
    tags = {t for c in captures for t in c["tags"]}
    assert {"probe:models", "probe:streaming", "probe:tools", "probe:vision", "probe:long_context"} <= tags
    streamed = [c for c in captures if "probe:streaming" in c["tags"]]
    assert streamed[0]["stream"] is True and streamed[0]["first_token_ms"] is not None


def test_json_report_and_decode_rate(healthy):
    result = probe("--upstream", healthy.url + "/v1", "--no-capture", "--json", "--only", "streaming,models")
    assert result.returncode == 0
    report = report_of(result)
    assert report["ok"] is True and report["model"] == "tapfix-mock"
    assert [r["check"] for r in report["results"]] == ["models", "streaming"]
    streaming = report["results"][1]
    assert streaming["data"]["tokens_per_s"] > 0 and streaming["data"]["ttft_ms"] >= 0
    assert "tok/s decode" in streaming["detail"]


def test_model_not_served_exit_1(wrong_ids):
    result = probe(
        "--upstream",
        wrong_ids.url,
        "--model",
        "tapfix-mock",
        "--no-capture",
        "--json",
        "--only",
        "models,completion",
    )
    assert result.returncode == 1
    rows = {r["check"]: r for r in report_of(result)["results"]}
    assert rows["models"]["status"] == "fail"
    assert rows["models"]["detail"] == (
        "model 'tapfix-mock' is not served; /v1/models lists: "
        "Qwen/Qwen3-30B-A3B-Instruct-2507, Qwen/Qwen3-Coder-30B-A3B-Instruct"
    )
    assert rows["completion"]["detail"] == "HTTP 404: The model `tapfix-mock` does not exist."


@pytest.mark.parametrize(
    ("scenario", "check", "detail"),
    [
        ("ignore_images", "vision", "the answer ignored the image: \"I don't see an image in your message."),
        ("broken_tool_args", "tools", "tool call arguments are not valid JSON: Unterminated string"),
        (
            "forget_needle",
            "long_context",
            "the passphrase planted at depth 0.5 of ~2000 tokens was not recalled",
        ),
        ("ignore_effort", "reasoning", "reasoning length did not change with effort: none="),
        ("cjk_drift", "completion", "the answer drifts out of English into CJK script"),
        ("repeat_loop", "completion", "the answer loops: 'I will now check the file again"),
    ],
)
def test_failing_server_exit_1(module_tmp, scenario, check, detail):
    mock = start_mock(module_tmp, "--scenario", f"probe_failures/{scenario}")
    try:
        result = probe("--upstream", mock.url, "--no-capture", "--json", "--only", check)
    finally:
        mock.stop()
    assert result.returncode == 1, result.stdout
    (row,) = report_of(result)["results"]
    assert row["status"] == "fail" and row["detail"].startswith(detail), row


def test_nothing_listening_exit_2():
    port = free_port()
    result = probe("--upstream", f"http://127.0.0.1:{port}", "--no-capture")
    assert result.returncode == 2
    assert f"cannot connect to http://127.0.0.1:{port}/v1/models" in result.stdout.decode()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give either --upstream URL or --config FILE"),
        (
            ("--upstream", "http://127.0.0.1:1", "--config", "x.toml"),
            "give either --upstream URL or --config FILE",
        ),
        (("--upstream", "http://127.0.0.1:1", "--only", "bogus"), "unknown check bogus"),
        (("--upstream", "ftp://127.0.0.1:1"), "expected an http:// or https:// URL"),
        (("--upstream", "http://127.0.0.1:1", "--needle-depth", "2"), "--needle-depth"),
        (
            ("--upstream", "http://127.0.0.1:1", "--key-env", "TAPFIX_PROBE_UNSET_KEY"),
            "TAPFIX_PROBE_UNSET_KEY",
        ),
        (("--config", "/nonexistent/tapfix.toml"), "cannot read the config file"),
    ],
)
def test_usage_errors_exit_2(args, message):
    result = probe(*args, "--no-capture")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr.decode()


def test_config_mode_checks_every_served_id_and_reports_sampling(healthy, wrong_ids, tmp_path):
    config = tmp_path / "tapfix.toml"
    config.write_text(
        toml_table("upstreams.gpu0", base_url=f"{healthy.url}/v1", engine="vllm")
        + toml_table("upstreams.gpu1", base_url=wrong_ids.url, engine="vllm")
        + toml_table("models.mock", upstream="gpu0", upstream_model="tapfix-mock", aliases=["m"])
        + toml_table("models.mock.sampling", temperature=0.6, presence_penalty=1.5)
        + toml_table("models.coder", upstream="gpu1", upstream_model="Qwen/Qwen3-Coder-30B-A3B-Instruct")
        + toml_table("models.qwen", upstream="gpu1", upstream_model="Qwen/Qwen3-30B-A3B")
    )
    result = probe("--config", str(config), "--no-capture", "--json", "--only", "models,completion,sampling")
    assert result.returncode == 1
    rows = {(r["model"], r["check"]): r for r in report_of(result)["results"]}
    models = rows[("*", "models")]
    assert models["status"] == "fail"
    assert models["detail"] == (
        "model 'qwen' ('Qwen/Qwen3-30B-A3B') is not served by upstream gpu1; /v1/models lists: "
        "Qwen/Qwen3-30B-A3B-Instruct-2507, Qwen/Qwen3-Coder-30B-A3B-Instruct; "
        "did you mean 'Qwen/Qwen3-30B-A3B-Instruct-2507'?"
    )
    assert rows[("mock", "completion")]["status"] == "pass"
    assert rows[("coder", "completion")]["status"] == "pass"
    assert rows[("qwen", "completion")]["detail"] == "HTTP 404: The model `Qwen/Qwen3-30B-A3B` does not exist."
    assert rows[("mock", "sampling")]["detail"] == (
        "tapfix fills temperature=0.6 (config models.mock.sampling.temperature); "
        "presence_penalty=1.5 (config models.mock.sampling.presence_penalty)"
    )

    # One model by alias: only its upstream is listed, and it passes.
    one = probe("--config", str(config), "--model", "m", "--no-capture", "--json")
    assert one.returncode == 0, one.stdout
    report = report_of(one)
    assert {r["model"] for r in report["results"]} == {"*", "mock"}
    assert all(r["status"] == "pass" for r in report["results"])

    unknown = probe("--config", str(config), "--model", "nope", "--no-capture")
    assert unknown.returncode == 2 and "model 'nope' is not in" in unknown.stderr.decode()


def test_probe_help_is_documented():
    from tapfix.proxy.cli import main

    assert "probe" in main.list_commands(None)
    result = probe("--help")
    assert result.returncode == 0 and b"Deep health probe" in result.stdout


def test_unreachable_server_is_exit_code_2():
    async def go() -> ProbeReport:
        return await run_probe(f"http://127.0.0.1:{port}", None, timeout=2)

    port = free_port()
    report = asyncio.run(go())
    assert report.exit_code == 2 and not report.ok and report.results == []
    assert report.unreachable and report.unreachable.startswith(f"cannot connect to http://127.0.0.1:{port}/v1/models")
