"""opentelemetry stays unimported unless export is on (a fresh interpreter, so earlier imports can't hide one).
Bad `--otlp` / `--browse-url` / OTEL_* values: tests/unit/cli/test_otlp_options.py."""

from __future__ import annotations

import subprocess
import sys

from click.testing import CliRunner
from tapfix.proxy.cli import main


def test_help_and_the_cli_never_import_opentelemetry():
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from tapfix.proxy.cli import main\n"
        "import tapfix.proxy.telemetry.config, tapfix.proxy.telemetry.turn, tapfix.proxy.telemetry.semconv\n"
        "for args in (['--help'], ['run', '--help']):\n"
        "    assert CliRunner().invoke(main, args).exit_code == 0\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout
    help_text = CliRunner().invoke(main, ["run", "--help"]).output
    assert "--otlp URL" in help_text and "--browse-url URL" in help_text
