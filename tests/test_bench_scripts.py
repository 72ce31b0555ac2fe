"""The benchmark scripts still reach what they measure: a module move must break them loudly.

`bench/` is not imported by the suite, so a rename in `proxy/` could leave a script timing a
fallback (or nothing) without any test noticing. Every `tapfix.*` name a script imports, at the
top or inside a function, and every `tapfix.*` module it runs with `python -m`, must resolve.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = sorted(BENCH.glob("*.py"))
MODULE_NAME = re.compile(r"^tapfix\.(proxy|addons)(\.\w+)*$")


def _targets(path: Path) -> list[tuple[str, str | None]]:
    """(module, attribute or None) for every tapfix import and `-m tapfix...` string in a script."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tapfix"):
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names if alias.name.startswith("tapfix")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.match(node.value):
            found.append((node.value, None))
    return found


def test_there_are_bench_scripts_with_tapfix_imports() -> None:
    assert sum(len(_targets(p)) for p in SCRIPTS) >= 5


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_tapfix_name_a_bench_script_uses_resolves(script: Path) -> None:
    missing = []
    for module, attr in _targets(script):
        if importlib.util.find_spec(module) is None:
            missing.append(module)
        elif attr is not None:
            mod = importlib.import_module(module)
            if not hasattr(mod, attr) and importlib.util.find_spec(f"{module}.{attr}") is None:
                missing.append(f"{module}.{attr}")
    assert not missing, f"{script.name} uses names that no longer exist: {missing}"
