"""`cutoff.py`: what says a turn `max_tokens` ended was cut inside or after its calls (issue 31 items 10
and 13; docs/repair.md, "A turn max_tokens ended"), both ways, on the text.

Every cut of every registered format's rendering past its opener says so (the rule asks the registry,
not a list of openers); the whole rendering doesn't, nor prose that only mentions markup, a fenced
example or a call of a tool that isn't offered. A cut example inside any container of prose stays text
(the position rule, asked of the completed markup), whole or with its container opened by text sent
before. The stages' side: tests/unit/test_toolcalls_length.py and tests/unit/test_toolcalls_length_evented.py.
"""

from __future__ import annotations

import random

import pytest
from tapfix.proxy.mock.mutations_prose import CONTAINERS, in_container
from tapfix.proxy.toolcalls.cutoff import cut_markup, turn_sign
from tapfix.proxy.toolcalls.formats import REGISTRY, armed
from tapfix.proxy.toolcalls.formats.blocks import Context
from tapfix.proxy.toolcalls.schema import ToolSchemas

from tests.support.builders import tool
from tests.support.depth import draws
from tests.unit.test_toolcalls_length import PROSE

WRITE = tool("write", {"filePath": {"type": "string"}, "content": {"type": "string"}}, ["filePath", "content"])
BASH = tool("bash", {"command": {"type": "string"}})  # nothing required: `{}` would be a whole call
TOOLS = [WRITE, BASH]
SCHEMAS = ToolSchemas(TOOLS)
EVERY = armed(None)
LS = ("bash", {"command": "ls -la"})
WRITE_A = ("write", {"filePath": "a.txt", "content": 'hi there\nline 2 "q"'})


def renders(name: str) -> tuple[str, str | None]:
    """A format's markup of one call, and of two (None for a format whose template writes one per turn)."""
    fmt = REGISTRY[name]
    one = fmt.render([LS])
    try:
        two: str | None = fmt.render([LS, WRITE_A])
    except ValueError:
        two = None
    return one, two


def first_opener_end(text: str, name: str) -> int:
    """Where a cut starts to be a cut call: past the format's opener (its first character when it has none)."""
    if REGISTRY[name].anchored:
        return len(text) - len(text.lstrip()) + 1
    found = EVERY.opener_re.search(text) if EVERY.opener_re is not None else None
    assert found is not None
    return found.end()


FORMATS = sorted(n for n in REGISTRY if n != "llama3_python_tag")  # its template renders no JSON arguments


# -- the rule, on the text ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", FORMATS)
def test_every_cut_of_a_formats_markup_past_its_opener_says_the_turn_was_cut(name: str) -> None:
    one, two = renders(name)
    whole = two if two is not None else REGISTRY[name].render([WRITE_A])
    start = first_opener_end(whole, name)
    complete = {one.strip(), whole.strip()}  # one call's whole markup (trailing whitespace aside) is no cut
    cuts = [whole[:k] for k in range(start, len(whole)) if whole[:k].strip() not in complete]
    missed = [cut[-40:] for cut in cuts if turn_sign(cut, SCHEMAS, EVERY) is None]
    assert not missed, f"{len(missed)} of {len(cuts)} cuts read as a finished turn, e.g. {missed[:3]}"


@pytest.mark.parametrize("name", FORMATS)
def test_a_formats_whole_markup_is_no_cut(name: str) -> None:
    one, two = renders(name)
    for whole in filter(None, (one, two, one + "\n")):
        assert turn_sign(whole, SCHEMAS, EVERY) is None, whole


@pytest.mark.parametrize("text", [*PROSE, "日本語の説明です。<tool_call>タグで"])
def test_prose_that_max_tokens_cut_is_no_cut_call(text: str) -> None:
    assert cut_markup(text, SCHEMAS, EVERY, at_start=True) is None
    assert turn_sign(text, SCHEMAS, EVERY) is None


# -- the position rule on a cut example (docs/formats.md, "What counts as a call") --------------------------
# Containers hold their example whatever follows it; a sentence around the markup (`mid_sentence`,
# `wrapped_sentence`) is prose after it, which a cut removes: that cut example is read as the cut call it
# would be at the end of a turn.
CUT_CONTAINERS = sorted(set(CONTAINERS) - {"mid_sentence", "wrapped_sentence"})
_SENTINEL = "\x00"


def in_prose(kind: str, seed: int, markup: str) -> str:
    """`markup` placed as `in_container` places it (the prose up to it, each of its lines indented as the
    container indents them), without the prose after it."""
    example = CONTAINERS[kind](random.Random(seed), _SENTINEL)
    before = example[: example.index(_SENTINEL)]
    pad = before[len(before.rstrip(" \t")) :] if kind == "indented_code" else ""
    return before + markup.replace("\n", "\n" + pad)


# A format whose markup holds a blank line has no example in prose (the blank line ends any container before it).
IN_PROSE = [n for n in FORMATS if in_container(random.Random(0), CUT_CONTAINERS[0], renders(n)[0].strip()) is not None]
# A marker-less format counts only at the start of the content, never after prose.
UNANCHORED = [n for n in FORMATS if not REGISTRY[n].anchored]


@pytest.mark.parametrize("name", IN_PROSE)
def test_a_cut_example_in_a_container_stays_text(name: str) -> None:
    """Every container's example of the format's markup, cut past its opener: no cut call, read whole or
    with its container opened by text that went out before (the chat stage's held text and its context)."""
    one = renders(name)[0].strip()  # as `in_container` places it
    start = first_opener_end(one, name)
    points = range(start, len(one), max(1, (len(one) - start) // 6))
    wrong = []
    for n, kind in enumerate(CUT_CONTAINERS):
        for seed in draws(2, n + len(name)):  # one prose draw of the two at the quick depth (tests/support/depth.py)
            for k in points:
                text = in_prose(kind, seed, one[:k])
                at = len(in_prose(kind, seed, ""))
                sent = Context().feed(text[:at])
                if turn_sign(text, SCHEMAS, EVERY) is not None or (
                    turn_sign(text[at:], SCHEMAS, EVERY, context=sent, at_start=False) is not None
                ):
                    wrong.append(text[-60:])
    assert not wrong, f"{len(wrong)} cut examples read as cut calls, e.g. {wrong[:3]}"


@pytest.mark.parametrize("name", UNANCHORED)
def test_a_cut_call_after_prose_is_a_cut(name: str) -> None:
    """The same cuts where a call stands (after a sentence, on its own line; with the sentence sent before):
    the turn was cut inside a call."""
    one, _ = renders(name)
    start = first_opener_end(one, name)
    missed = []
    for k in range(start, len(one.rstrip()), max(1, (len(one) - start) // 6)):
        for prose in ("Let me check.\n", "Sure.\n\n", "I'll run it now."):
            sent = Context().feed(prose)
            if turn_sign(prose + one[:k], SCHEMAS, EVERY) is None or (
                turn_sign(one[:k], SCHEMAS, EVERY, context=sent, at_start=False) is None
            ):
                missed.append((prose + one[:k])[-60:])
    assert not missed, f"{len(missed)} cut calls read as a finished turn, e.g. {missed[:3]}"
