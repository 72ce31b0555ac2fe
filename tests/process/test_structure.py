"""The structure the code keeps: mypy's strict types (see [tool.mypy] in pyproject.toml), run as mypy runs;
the import rules are in tests/unit/test_structure.py. The canary proves mypy looks at the code."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.process.engine_suite import cache_root

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"proxy": ROOT / "proxy", "addons": ROOT / "addons"}

# --- mypy ---------------------------------------------------------------------------------------


def _link_tree(base: Path, canary: str | None = None) -> Path:
    """base/tapfix/{proxy,addons} pointing at the repository, the layout mypy can resolve (pyproject.toml
    says why). With a canary, base/tapfix/proxy is a real folder linking each entry, plus the canary."""
    tapfix = base / "tapfix"
    tapfix.mkdir(parents=True)  # (an existing base keeps its .mypy_cache)
    for name, source in PACKAGES.items():
        if name == "proxy" and canary is not None:
            (tapfix / name).mkdir()
            for entry in source.iterdir():
                if entry.name != "__pycache__":
                    (tapfix / name / entry.name).symlink_to(entry)
            (tapfix / name / "_mypy_canary.py").write_text(canary)
        else:
            (tapfix / name).symlink_to(source)
    return base


def _mypy(tree: Path, targets: Iterable[str]) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "--cache-dir",
        str(tree / ".mypy_cache"),
        "--no-color-output",
        "--no-error-summary",
        *targets,
    ]
    return subprocess.run(command, cwd=tree, capture_output=True, text=True, timeout=300)


def test_mypy_is_clean():
    """In a tree that outlives the clone (TAPFIX_CACHE), so mypy's incremental cache carries over: a fresh
    clone's files have new mtimes, and mypy then compares each file's hash with the one it checked
    (27 s of a full check on 2 busy cores, a few seconds warm). One run at a time uses it (a lock)."""
    base = cache_root() / "mypy"
    base.mkdir(parents=True, exist_ok=True)
    with open(base / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(base / "tree" / "tapfix", ignore_errors=True)  # the links of the last clone that ran
        tree = _link_tree(base / "tree")
        result = _mypy(tree, ["-p", "tapfix.proxy", "-p", "tapfix.addons"])
    if result.returncode != 0:
        pytest.fail(f"mypy (strict, config in pyproject.toml):\n{result.stdout}{result.stderr}", pytrace=False)


CANARY = """\
from tapfix.proxy.ids import new_capture_id


def wrong_return() -> int:
    return "not an int"


def unannotated(value):
    return value


def through_the_namespace() -> int:
    return new_capture_id()
"""


def test_mypy_reports_errors_inside_the_namespace(tmp_path):
    """The same config and tree reports a wrong return type, strict's missing annotation, and a type
    that only a resolved `tapfix.proxy` import can give."""
    tree = _link_tree(tmp_path, canary=CANARY)
    result = _mypy(tree, ["-m", "tapfix.proxy._mypy_canary"])
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    canary = "tapfix/proxy/_mypy_canary.py"
    assert f'{canary}:5: error: Incompatible return value type (got "str", expected "int")  [return-value]' in out
    assert f"{canary}:8: error: Function is missing a type annotation  [no-untyped-def]" in out
    assert f'{canary}:13: error: Incompatible return value type (got "str", expected "int")  [return-value]' in out
