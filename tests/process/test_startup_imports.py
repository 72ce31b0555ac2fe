"""What a command imports before it does anything (the cost itself is measured by bench/startup.py).

`tapfix --help` lists every command without importing a store, a probe or an HTTP client, and opening a
store never drags numpy or pandas in through sqlite-utils (which imports them, when installed, only for
column types tapfix never uses). Each check runs in a fresh interpreter, so earlier imports can't hide one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner
from tapfix.proxy.cli.main import LazyGroup, main


def _modules_after(code: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


HEAVY = ("numpy", "pandas", "sqlite_utils", "httpx", "jsonschema", "mitmproxy", "opentelemetry")
_REPORT = f"import json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))\n"


def test_help_imports_no_store_no_probe_no_http_client() -> None:
    code = (
        "from click.testing import CliRunner\nfrom tapfix.proxy.cli import main\n"
        "result = CliRunner().invoke(main, ['--help'])\nassert result.exit_code == 0, result.output\n" + _REPORT
    )
    assert _modules_after(code) == []


def test_opening_a_store_leaves_numpy_and_pandas_out(tmp_path: Path) -> None:
    code = (
        "import sys\nfrom tapfix.proxy.store.sqlite.database import open_for_writing, open_for_reading\n"
        f"open_for_writing({str(tmp_path / 'c.db')!r}).close()\n"
        f"open_for_reading({str(tmp_path / 'c.db')!r}).close()\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'numpy', 'pandas', 'sqlite_utils'})\n"
        "import numpy  # still importable by anything that wants it\n"
        "import json\nprint(json.dumps(loaded))\n"
    )
    assert _modules_after(code) == ["sqlite_utils"]


def test_the_listing_shows_each_lazy_command_as_its_own_help_would() -> None:
    """`summaries` stand in for the lazy commands' help until they load: they must say the same."""
    listing = CliRunner().invoke(main, ["--help"]).output
    for name in LazyGroup.lazy:
        command = main.get_command(None, name)  # type: ignore[arg-type]
        assert command is not None and command.help is not None
        assert command.help.strip().splitlines()[0] == LazyGroup.summaries[name]
        assert f"  {name}  " in listing.replace("    ", "  ")
    assert CliRunner().invoke(main, ["--help"]).output == listing  # loaded or not, the same listing
