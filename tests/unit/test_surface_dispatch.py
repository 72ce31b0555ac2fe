"""No code outside a surface's own package dispatches on a surface's name (issue 33): it asks the surface
object (`tapfix.proxy.surfaces`) instead. A comparison of a surface-holding expression with a surface's
name, a `match` over the names, or a dict keyed by them is a second home for what a surface is. The mock
is a separate program that imitates engines and keeps its own per-surface code."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAMES = frozenset({"chat", "completions", "responses", "messages"})
# Where the names belong: the surfaces themselves, and the mock engine.
OWN = (ROOT / "proxy" / "surfaces", ROOT / "proxy" / "mock")
# An expression that holds a surface: a name or attribute that says so, or what finds one.
SURFACE_ISH = re.compile(r"(^|[._])(surface|evented|surface_for\(.*\)|evented_(stream|body)\(.*\))$")


def _names_in(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in NAMES}
    return set()


def _surface_ish(node: ast.expr) -> bool:
    return SURFACE_ISH.search(ast.unparse(node)) is not None


def dispatches(tree: ast.AST) -> Iterable[tuple[int, str]]:
    """(line, what) for each dispatch on a surface's name in a parsed module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_names_in(o) for o in operands) and any(_surface_ish(o) for o in operands):
                yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in NAMES}
            if len(keys) >= 2:  # one key is a body's field (`{"messages": [...]}`)
                yield node.lineno, "a dict keyed by surface names: " + ast.unparse(node)[:80]
        elif isinstance(node, ast.match_case):
            pattern = node.pattern
            values = pattern.patterns if isinstance(pattern, ast.MatchOr) else [pattern]
            if any(isinstance(v, ast.MatchValue) and _names_in(v.value) for v in values):
                yield node.pattern.lineno, "a match case on a surface name: " + ast.unparse(node.pattern)


def _modules() -> Iterable[Path]:
    for top in ("proxy", "addons"):
        for path in sorted((ROOT / top).rglob("*.py")):
            if not any(path.is_relative_to(own) for own in OWN):
                yield path


def test_the_check_sees_each_kind_of_dispatch():
    source = """
if surface == "messages": pass
if ex.surface in ("chat", "responses"): pass
if surface_for(path) != "chat": pass
FIELDS = {"chat": "messages", "responses": "input"}
match surface:
    case "responses" | "messages": pass
if "messages" in parsed: pass  # a body's field, not a surface
"""
    found = [line for line, _ in dispatches(ast.parse(source))]
    assert found == [2, 3, 4, 5, 7]


def test_no_dispatch_on_a_surface_name_outside_the_surfaces():
    modules = list(_modules())
    assert len(modules) > 100, "the scan sees the code"
    violations = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in modules
        for line, what in dispatches(ast.parse(path.read_text(), str(path)))
    ]
    if violations:
        pytest.fail(f"{len(violations)} dispatches on a surface's name:\n  " + "\n  ".join(violations), pytrace=False)
