"""The structure the code keeps: the import rules (the core stands apart from mitmproxy and the addons; addons
stand apart from each other; no cycles); mypy's strict types in tests/process/test_structure.py. Each check
also proves it looks at something, so a setup that silently checks nothing fails."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"proxy": ROOT / "proxy", "addons": ROOT / "addons"}

# The one import from the core into the runner: `tapfix run` starting mitmproxy, inside a function so
# `tapfix --help` and every other command start without mitmproxy.
RUNNER_ENTRY = ("tapfix.proxy.cli.run", "tapfix.addons.runner.master")


# --- import rules -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    # Function-level imports are edges too: grimp reads every import statement, not only the top ones.
    built = grimp.build_graph("tapfix.proxy", "tapfix.addons", include_external_packages=True, cache_dir=None)
    assert len([m for m in built.modules if m.startswith("tapfix.")]) > 50, "the graph holds the packages"
    return built


def _internal(module: str) -> bool:
    return module.startswith(("tapfix.proxy", "tapfix.addons"))


def _edges(graph: grimp.ImportGraph) -> Iterable[tuple[str, str]]:
    for importer in sorted(m for m in graph.modules if _internal(m)):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            yield importer, imported


def _where(graph: grimp.ImportGraph, importer: str, imported: str) -> str:
    lines = [str(d["line_number"]) for d in graph.get_import_details(importer=importer, imported=imported)]
    return f"{importer} -> {imported} (line {', '.join(lines)})"


def _fail_with(title: str, violations: list[str]) -> None:
    if violations:
        pytest.fail(f"{title}:\n  " + "\n  ".join(violations), pytrace=False)


def test_the_core_imports_neither_mitmproxy_nor_the_addons(graph):
    violations = [
        _where(graph, importer, imported)
        for importer, imported in _edges(graph)
        if importer.startswith("tapfix.proxy")
        and (imported.startswith("tapfix.addons") or imported == "mitmproxy")
        and (importer, imported) != RUNNER_ENTRY
    ]
    _fail_with("tapfix.proxy imports tapfix.addons or mitmproxy", violations)


def test_the_runner_entry_is_a_function_level_import(graph):
    """The allowed exception is seen (so function-level imports are counted) and stays lazy."""
    importer, imported = RUNNER_ENTRY
    assert graph.direct_import_exists(importer=importer, imported=imported)
    path = PACKAGES["proxy"].joinpath(*importer.split(".")[2:]).with_suffix(".py")
    eager = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for node in _module_level_imports(ast.parse(path.read_text()))
        if any(name.startswith("tapfix.addons") for name in _imported_names(node))
    ]
    _fail_with("imports of tapfix.addons that run when the CLI loads", eager)


def _module_level_imports(tree: ast.Module) -> Iterable[ast.Import | ast.ImportFrom]:
    """Imports that run when the module loads: everything outside function bodies."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            pending.extend(ast.iter_child_nodes(node))


def _imported_names(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return [node.module or ""]


def _addon(module: str) -> str | None:
    """The addon a module belongs to: a direct child of tapfix.addons, not the runner or the package."""
    parts = module.split(".")
    if len(parts) < 3 or parts[:2] != ["tapfix", "addons"] or parts[2] == "runner":
        return None
    return ".".join(parts[:3])


def test_addons_do_not_import_each_other(graph):
    """addons/__init__.py gathers the addon classes for default_addons(); an addon importing it imports
    every other addon, so that counts too."""
    violations = [
        _where(graph, importer, imported)
        for importer, imported in _edges(graph)
        if (own := _addon(importer)) is not None
        and (imported == "tapfix.addons" or (_addon(imported) not in (None, own)))
    ]
    _fail_with("addons importing other addons", violations)


def _cycles(edges: dict[str, list[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            step = next(successors, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(edges[step])))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycles_are_found():
    edges = {"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"], "e": ["e"]}
    assert _cycles(edges) == [["a", "b", "c"]]


def test_no_import_cycles(graph):
    edges: dict[str, list[str]] = {m: [] for m in graph.modules if _internal(m)}
    for importer, imported in _edges(graph):
        if _internal(imported):
            edges[importer].append(imported)
    violations = []
    for cycle in _cycles(edges):
        inside = [_where(graph, a, b) for a in cycle for b in edges[a] if b in cycle]
        violations.append(" <-> ".join(cycle) + "".join(f"\n      {edge}" for edge in inside))
    _fail_with("import cycles", violations)


def _package_of(module: str) -> str | None:
    """The package of `tapfix.proxy` a module lives in (`config` for tapfix.proxy.config.file); None for
    the top-level modules (tapfix.proxy.sse, tapfix.proxy.quantities)."""
    parts = module.split(".")
    if len(parts) < 3 or parts[:2] != ["tapfix", "proxy"]:
        return None
    return parts[2] if (PACKAGES["proxy"] / parts[2]).is_dir() else None


# What config/ may import: proxy's top-level modules (None) and the words packages share (vocabulary/).
BELOW_CONFIG = (None, "vocabulary", "config")


def test_config_stands_on_the_shared_modules_only(graph):
    """config/ (the declared settings, the config file) is imported by the packages that take settings, so
    it imports none of them: only proxy's top-level modules and `vocabulary/`, where shared words such as
    `ToolRepairPolicy` live. A base for the layers contract."""
    seen = [
        (importer, imported)
        for importer, imported in _edges(graph)
        if _package_of(importer) == "config" and imported.startswith("tapfix.")
    ]
    assert ("tapfix.proxy.config.settings", "tapfix.proxy.vocabulary.repair_policy") in seen, "sees config's imports"
    violations = [
        _where(graph, importer, imported)
        for importer, imported in seen
        if _package_of(imported) not in BELOW_CONFIG or imported.startswith("tapfix.addons")
    ]
    _fail_with("tapfix.proxy.config imports a package above it", violations)


def test_the_shared_words_import_nothing_of_tapfix(graph):
    """vocabulary/ is the bottom: what it says needs no other part of tapfix."""
    seen = [(a, b) for a, b in _edges(graph) if _package_of(a) == "vocabulary"]
    assert seen, "the check sees vocabulary's imports"
    violations = [_where(graph, a, b) for a, b in seen if b.startswith("tapfix.") and _package_of(b) != "vocabulary"]
    _fail_with("tapfix.proxy.vocabulary imports another part of tapfix", violations)


# The layers of tapfix.proxy, top to bottom: a layer may import the layers below it, never one above; the
# parts of one layer don't import each other. Every package and top-level module of proxy/ is in one.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli",),  # the commands: everything below, and the runner's entry into the addons
    ("browse",),  # the capture browser reads the store and exports replays
    ("replay", "probe"),  # tools that drive an upstream with recorded or scripted requests
    ("response",),  # the live response pipeline, which hands a failed attempt to regeneration
    ("regenerate",),  # re-asking the upstream; its attempts are traced
    ("telemetry",),  # spans and metrics, read from what the store records and the request side changed
    ("store", "mock"),  # captures at rest; the mock engine (it speaks the tool-call formats)
    ("request",),  # the request side: sampling, reasoning dialects, routing, preflight
    ("toolcalls", "window"),  # tool-call formats and repair; the context window
    ("errors", "assemble", "config", "exchange"),  # tapfix's own answers, the assembled answer, settings, one exchange
    ("surfaces",),  # what each API surface is on the request side and the wire, its error shape included
    (
        "changes",
        "chunked",
        "content_encoding",
        "http_headers",
        "ids",
        "jsonbody",
        "jsonsplice",
        "net",
        "quantities",
        "sse",
        "sse_envelope",
        "vocabulary",
    ),  # fmt: skip  # the shared words and wire primitives
)


def test_every_part_of_the_core_has_a_layer():
    parts = {p.stem for p in PACKAGES["proxy"].iterdir() if (p.is_dir() and (p / "__init__.py").exists()) or (
        p.suffix == ".py" and p.name != "__init__.py")}  # fmt: skip
    assert parts == {tail for layer in LAYERS for tail in layer}


def test_the_layers_hold(graph):
    """grimp's layers contract, package to package, with no ignore list: an import (direct or through
    other modules) from a lower layer to a higher one, or between the parts of one layer, fails."""
    layers = [grimp.Layer(*layer, independent=True) for layer in LAYERS]
    illegal = graph.find_illegal_dependencies_for_layers(layers=layers, containers={"tapfix.proxy"})
    violations = [
        f"{dep.importer} -> {dep.imported}: "
        + "; ".join(" -> ".join([min(route.heads), *route.middle, min(route.tails)]) for route in dep.routes)
        for dep in sorted(illegal, key=lambda d: (d.importer, d.imported))
    ]
    _fail_with("a layer imports one above it (or a sibling)", violations)


def test_the_layers_contract_sees_a_violation():
    """Not vacuous: the same check on a graph with one upward import reports it."""
    graph = grimp.ImportGraph()
    for module in ("tapfix.proxy", "tapfix.proxy.store", "tapfix.proxy.store.writer", "tapfix.proxy.cli"):
        graph.add_module(module)
    graph.add_import(importer="tapfix.proxy.store.writer", imported="tapfix.proxy.cli", line_number=1, line_contents="")
    layers = [grimp.Layer(*layer, independent=True) for layer in LAYERS]
    illegal = graph.find_illegal_dependencies_for_layers(layers=layers, containers={"tapfix.proxy"})
    assert {(d.importer, d.imported) for d in illegal} == {("tapfix.proxy.store", "tapfix.proxy.cli")}
