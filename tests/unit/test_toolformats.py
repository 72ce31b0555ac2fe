"""The registry of tool-call formats: every family is there, and each format reads its own vectors.

Vectors live in tests/vectors/toolformats/<format>.json: markup rendered from the family's chat
template (tests/vectors/render_template.py), hostile vectors (prose around and between calls, several
calls, Python literals, schema-typed XML values, code whose whitespace must survive, CJK, a name the
format leaves out), and decoys that must stay text (`"calls": []`). Every format must also read back
what it renders, with prose around it, for generated calls.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tapfix.proxy.toolcalls.formats import REGISTRY, UnknownFormat, armed, names
from tapfix.proxy.toolcalls.formats.base import typed_calls
from tapfix.proxy.toolcalls.schema import ToolSchemas

from tests.support.builders import tool
from tests.support.depth import examples

VECTORS = Path(__file__).parents[1] / "vectors" / "toolformats"

# Every family issue 17 names, with its older and newer forms: the registry's names must include these.
REQUIRED = [
    "hermes",
    "mistral_v3",
    "mistral_v11",
    "qwen3_coder",
    "kimi_k2",
    "deepseek_r1",
    "deepseek_v3",
    "deepseek_v31",
    "deepseek_v32_dsml",
    "glm45",
    "glm47",
    "llama3_json",
    "llama3_python_tag",
    "pythonic",
    "lfm2",
    "granite",
    "internlm",
    "jamba",
    "minimax_m1",
    "minimax_m2",
    "phi4_mini",
    "hunyuan",
    "seed_oss",
    "step3",
    "longcat",
    "xlam",
    "gemma",
    "gemma4",
    "command_r",
    "command_a",
    "nemotron",
    "gigachat",
    "apertus",
    "pangu",
    "minicpm",
    "poolside",
    "functionary_v31",
    "functionary_v32",
    "firefunction",
    "harmony",
]


def _load() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(VECTORS.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        for k, vector in enumerate(data["vectors"]):
            out.append((f"{data['format']}#{k}", {**vector, "format": data["format"]}))
    return out


ALL_VECTORS = _load()


def test_the_registry_holds_every_family() -> None:
    missing = sorted(set(REQUIRED) - set(names()))
    assert not missing, f"formats not registered: {missing}"


def test_an_unknown_format_names_the_registered_ones() -> None:
    with pytest.raises(UnknownFormat) as info:
        armed("no-such-format")
    assert "hermes" in str(info.value)


def _typed(calls: list[tuple[str, Any]], tools: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(str(name), args) for name, args in typed_calls(list(calls), tools)]


@pytest.mark.parametrize(("vid", "vector"), ALL_VECTORS, ids=[v for v, _ in ALL_VECTORS])
def test_vector(vid: str, vector: dict[str, Any]) -> None:
    tools = vector["tools"]
    offered = ToolSchemas(tools).names
    expected = [(c["name"], c["arguments"]) for c in vector["calls"]]
    for formats in (armed(), armed(vector["format"])):  # every format armed, and this one pinned
        found = formats.find(vector["text"], offered, at_start=vector.get("at_start", True))
        if not expected:
            assert found is None or not found.confirmed, f"{vid}: a decoy read as {found.calls}"
            continue
        assert found is not None and found.confirmed, f"{vid}: no call read from {vector['text']!r}"
        assert found.fmt.name == vector["format"], f"{vid}: read as {found.fmt.name}"
        assert _typed(found.calls, tools) == expected, vid


def test_every_format_has_vectors_of_both_kinds() -> None:
    by_format: dict[str, set[str]] = {}
    for _, vector in ALL_VECTORS:
        kind = vector["source"].split(":", 1)[0]
        by_format.setdefault(vector["format"], set()).add(kind)
    lacking = {
        name: sorted({"template", "hostile"} - by_format.get(name, set()))
        for name in REGISTRY
        if not {"template", "hostile"} <= by_format.get(name, set())
    }
    assert not lacking, f"formats without template-rendered or hostile vectors: {lacking}"


NAMES = st.text(string.ascii_lowercase + "_", min_size=3, max_size=12).filter(lambda s: s.strip("_"))
VALUES = st.one_of(
    st.text(string.ascii_letters + string.digits + " .,:/-_\n\t中文é", max_size=30),
    st.integers(-1000, 1000),
    st.booleans(),
    st.lists(st.text(string.ascii_letters, max_size=5), max_size=3),
)
ARGS = st.dictionaries(st.text(string.ascii_lowercase, min_size=1, max_size=6), VALUES, max_size=4)
PROSE = st.sampled_from(["", "Let me check.\n", "好的，我来查一下。\n", "Sure — calling the tool now.\n\n"])


def _tools_for(calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    props: dict[str, dict[str, Any]] = {}
    for name, args in calls:
        kinds = {bool: "boolean", int: "integer", str: "string", list: "array"}
        props.setdefault(name, {}).update({key: {"type": kinds[type(value)]} for key, value in args.items()})
    return [tool(n, p) for n, p in props.items()]


@pytest.mark.parametrize("name", sorted(REGISTRY))
@settings(max_examples=examples(25), deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(calls=st.lists(st.tuples(NAMES, ARGS), min_size=1, max_size=3), prose=PROSE)
def test_a_format_reads_back_what_it_renders(name: str, calls, prose: str) -> None:
    fmt = REGISTRY[name]
    names_seen: dict[str, dict[str, Any]] = {}
    calls = [(n, names_seen.setdefault(n, a)) for n, a in calls]  # one schema per name
    try:
        text = fmt.render(calls)
    except ValueError:
        return  # a format that can't carry these calls (e.g. one call only): its vectors cover it
    text = (prose + text) if not fmt.anchored else text
    tools = _tools_for(calls)
    offered = ToolSchemas(tools).names
    found = armed(name).find(text, offered)
    assert found is not None and found.confirmed, text
    assert _typed(found.calls, tools) == calls, text


def test_an_alias_arms_the_formats_that_declare_it() -> None:
    """Poolside's Laguna templates render GLM's markup byte for byte (the glm vectors hold renders of
    all three): pinning `poolside` arms both GLM forms and nothing else."""
    assert sorted(f.name for f in armed("poolside").formats) == ["glm45", "glm47"]
    assert "poolside" in names()
