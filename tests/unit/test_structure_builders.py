"""No test module grows its own copy of a wire builder: tools, chunks, tool-call deltas and SSE framing
live in tests/support/builders.py, once.

The rule, checked on the syntax tree of every `tests/**/*.py` except the builders module itself:

1. No function (at any depth) is *named* like a builder: `chunk(s)`, `chat_chunk`, `delta(s)`,
   `tool(s)`, `tool_call(s)`, `tool_delta`, `tool_call_delta`, `tc`, `call`, `ev`, `event`, `sse`,
   `sse_bytes`, `sse_event(s)`, `envelope`, each with an optional leading underscore.
2. No function that is not itself a test (`test_*`) or a pytest fixture *builds* one, whatever its name:
   - a dict display with `"object": "chat.completion.chunk"` (a chunk),
   - a dict display with `"type": "function"` and a `"function"` key (a tool definition or tool call),
   - SSE framing: `"data: " + ...` or an f-string that starts with `data: `.

A test or fixture may still spell out the exact bytes or objects it feeds or expects: that is test
data, not a builder. Binding a builder's parameters once (`chunk = partial(chat_chunk, id=...)`) is allowed:
the bytes are still built in one place.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
BUILDERS = TESTS / "support" / "builders.py"
BUILDER_NAME = re.compile(
    r"^_?(chunks?|chat_chunk|deltas?|tools?|tool_calls?|tool_delta|tool_call_delta|tc|call|ev|event"
    r"|sse|sse_bytes|sse_events?|envelope)$"
)


def _str(node: ast.AST | None) -> str | bytes | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes) else None


def _builds(node: ast.AST) -> str | None:
    """What `node` builds, when it is one of the wire objects of rule 2."""
    if isinstance(node, ast.Dict):
        items = {_str(k): v for k, v in zip(node.keys, node.values, strict=True) if _str(k) is not None}
        if _str(items.get("object")) == "chat.completion.chunk":
            return "a chat.completion.chunk"
        if _str(items.get("type")) == "function" and "function" in items:
            return "a tool definition or tool call"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left: ast.AST = node
        while isinstance(left, ast.BinOp) and isinstance(left.op, ast.Add):
            left = left.left
        text = _str(left)
        if text is not None and text[:6] in ("data: ", b"data: "):
            return "an SSE event"
    if isinstance(node, ast.JoinedStr) and node.values and str(_str(node.values[0]) or "").startswith("data: "):
        return "an SSE event"
    return None


def _is_fixture(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "fixture"


def copies_in(path: Path, root: Path = TESTS.parent) -> list[str]:
    """Every copy in `path`, as `file:line name() why` with the file relative to `root`."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        where = f"{path.relative_to(root)}:{fn.lineno} {fn.name}()"
        if BUILDER_NAME.match(fn.name):
            found.append(f"{where} is named like a builder")
        if fn.name.startswith("test_") or any(_is_fixture(d) for d in fn.decorator_list):
            continue
        for node in ast.walk(fn):
            if what := _builds(node):
                found.append(f"{where} builds {what} (line {getattr(node, 'lineno', '?')})")
                break
    return found


def _test_modules() -> list[Path]:
    """The suite's own modules: not what installs under tests/ (the agents' node_modules ship Python too)."""
    return [
        p
        for p in sorted(TESTS.rglob("*.py"))
        if p != BUILDERS
        and not any(part.startswith(".") or part == "node_modules" for part in p.relative_to(TESTS).parts)
    ]


def test_no_test_module_defines_its_own_wire_builder() -> None:
    copies = [c for path in _test_modules() for c in copies_in(path)]
    assert not copies, "use tests/support/builders.py instead:\n" + "\n".join(copies)


def test_the_rule_catches_a_copy(tmp_path: Path) -> None:
    """The rule is not vacuous: each kind of copy it names is reported."""
    module = tmp_path / "test_copy.py"
    module.write_text(
        "def _chunk(delta):\n    return {}\n"
        "def make(delta):\n    return {'id': 'x', 'object': 'chat.completion.chunk', 'choices': []}\n"
        "def schema(name):\n    return {'type': 'function', 'function': {'name': name}}\n"
        "def frame(obj):\n    return b'data: ' + obj + b'\\n\\n'\n"
        "def frame2(text):\n    return f'data: {text}\\n\\n'\n"
        "def test_inline():\n    assert {'type': 'function', 'function': {}} and b'data: ' + b'x'\n"
        "@pytest.fixture\ndef stream():\n    return b'data: ' + b'x'\n"
    )
    assert [line.split(" ", 1)[1] for line in copies_in(module, tmp_path)] == [
        "_chunk() is named like a builder",
        "make() builds a chat.completion.chunk (line 4)",
        "schema() builds a tool definition or tool call (line 6)",
        "frame() builds an SSE event (line 8)",
        "frame2() builds an SSE event (line 10)",
    ]
