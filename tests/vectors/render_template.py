"""Render the tool-call markup a model family was trained to emit, from its own chat template.

A tool call placed in the assistant history and rendered with the family's template gives the exact
text the model writes. Templates ship in llama.cpp's `models/templates/`, e.g. inside the
`llama-cpp-python` sdist on PyPI (`pip download llama-cpp-python --no-deps --no-binary :all:`). The
vectors in tests/vectors/toolformats/ were rendered with this script and are checked in: the tests
never download anything.

    .venv/bin/python tests/vectors/render_template.py TEMPLATE.jinja CALLS.json [--tools TOOLS.json]

CALLS.json: [{"name": ..., "arguments": {...}}, ...]. Prints the assistant turn's text: the rendering
of [user, assistant with the calls] minus the rendering of [user] with the generation prompt.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere
from tests.support.builders import message_tool_call  # noqa: E402


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def environment() -> jinja2.Environment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime(2026, 1, 1).strftime(fmt)
    env.filters["tojson"] = lambda v, indent=None, ensure_ascii=False, **_: json.dumps(
        v, indent=indent, ensure_ascii=ensure_ascii
    )
    return env


def assistant_text(template: str, calls: list[dict[str, Any]], tools: list[dict[str, Any]], **extra: Any) -> str:
    """The assistant turn holding `calls`, as the template renders it."""
    tpl = environment().from_string(template)
    user = {"role": "user", "content": "Do it."}
    tool_calls = [message_tool_call(c["arguments"], id=f"call_{k}", name=c["name"]) for k, c in enumerate(calls)]
    assistant = {"role": "assistant", "content": extra.pop("content", ""), "tool_calls": tool_calls}
    common = {"tools": tools, "bos_token": "", "eos_token": "", **extra}
    before = tpl.render(messages=[user], add_generation_prompt=True, **common)
    both = tpl.render(messages=[user, assistant], add_generation_prompt=False, **common)
    if not both.startswith(before):
        # Some templates render the generation prompt differently from a finished turn's header:
        # cut at the longest common prefix instead.
        k = 0
        while k < min(len(before), len(both)) and before[k] == both[k]:
            k += 1
        return both[k:]
    return both[len(before) :]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("template", type=Path)
    ap.add_argument("calls", type=Path)
    ap.add_argument("--tools", type=Path)
    a = ap.parse_args()
    calls = json.loads(a.calls.read_text())
    tools = json.loads(a.tools.read_text()) if a.tools else []
    sys.stdout.write(assistant_text(a.template.read_text(), calls, tools))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
