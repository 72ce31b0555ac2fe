"""`tapfix run --otlp` / `--browse-url` and the OTEL_* variables: bad values are usage errors before
anything starts, and opentelemetry stays unimported unless export is on."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from tapfix.proxy.cli import main

UPSTREAM = ["run", "--upstream", "http://127.0.0.1:9"]


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--otlp", "127.0.0.1:4318"], {}, "--otlp"),
        (["--otlp", "http://"], {}, "--otlp"),
        (["--otlp", "http://127.0.0.1:6006", "--browse-url", "localhost:8090"], {}, "--browse-url"),
        ([], {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        (["--otlp", "http://h:1"], {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        (
            ["--otlp", "http://h:1"],
            {"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "ALL"},
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT",
        ),
    ],
)
def test_a_value_that_cannot_be_right_is_exit_2_on_one_line(args, env, named, tmp_path):
    result = CliRunner().invoke(main, [*UPSTREAM, "--db", str(tmp_path / "c.db"), *args], env=env)
    assert result.exit_code == 2, result.output
    error = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and named in error[0], result.stderr
    assert not (tmp_path / "c.db").exists()  # nothing started
