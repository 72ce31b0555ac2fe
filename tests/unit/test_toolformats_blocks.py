"""The block structure markup is judged in (`formats/blocks.py`): which container a point stands in, and
that a stream reading it delta by delta knows exactly what a reading of the whole text knows."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tapfix.proxy.toolcalls.formats.blocks import Context

from tests.support.depth import examples

# (text before the point, the container the point is in: "" at block level)
POINTS = [
    ("", ""),
    ("Let me check.\n", ""),
    ("Let me check.\n\n", ""),
    ("I'll write it now.", ""),
    ("```\nls\n```\n", ""),
    ("```\n", "fence"),
    ("```python\nx = 1\n", "fence"),
    ("````\n```\n", "fence"),  # a shorter run doesn't close a longer fence
    ("~~~\n", "fence"),
    ("~~~~ xml\n```\n", "fence"),  # backticks don't close a tilde fence
    ("~~~\n~~~\n", ""),
    ("```text ", "fence"),  # on the fence's own line: its info string
    ("    ", "code"),
    ("\t", "code"),
    ("Example:\n\n    ", "code"),
    ("  ", ""),
    ("<pre>", "html"),
    ("<PRE class='x'>\nline\n", "html"),
    ("<pre>a</pre> ", ""),
    ("It looks like <code>", "html"),
    ("Write `", "inline_code"),
    ("Write ``a ` b", "inline_code"),
    ("Write `a` then ", ""),
    ('He said "', "quoted"),
    ('He said "hi" and ', ""),
    ('A \\"escaped quote: ', ""),
    ("He said “", "quoted"),
    ("He said “hi” and ", ""),
    ("Er sagte „", "quoted"),
    ("Er sagte „ja“ und ", ""),
    ("Il a dit «", "quoted"),
    ("他说「", "quoted"),
    ("- ", "list"),
    ("* item\n", "list"),  # a lazy continuation of the item
    ("1. ", "list"),
    ("12) ", "list"),
    ("1. Example:\n\n   ", "list"),  # the item's content after a blank line
    ("1. Example:\n\nNew paragraph.\n", ""),
    ("- a\n\n", ""),
    ("-", ""),  # no space: no list marker
    ("> ", "quote"),
    ("> quoted\n", "quote"),
    ("> quoted\n\n", ""),
    ("| a | ", "table"),
    ("a | b\n--- | ---\nx | ", "table"),
    ("a | b\n", ""),
    ('"unbalanced\n\n', ""),  # quotes end with their paragraph
    ("`open\n\n", ""),
]


@pytest.mark.parametrize(("before", "container"), POINTS, ids=[repr(b) for b, _ in POINTS])
def test_the_container_of_a_point(before: str, container: str) -> None:
    assert Context().feed(before).point().container == container
    assert Context().point(before).container == container


@pytest.mark.parametrize(
    ("before", "ended"),
    [
        ("", True),
        ("Let me check.", True),
        ("好的，我来写。", True),
        ("Done!", True),
        ('He said "stop."', True),
        ("Ready 🚀", True),
        ("Never let a model emit", False),
        ("Reading it: ", False),
        ("Never let a model emit\n", False),
        ("Sentence.\n\n", True),
        ("<think>hmm</think>", True),
        ("<|im_start|>", True),
        ("Run `ls`", False),
    ],
)
def test_whether_the_prose_before_ends_a_sentence(before: str, ended: bool) -> None:
    assert Context().point(before).ended is ended


def test_think_is_open_until_closed() -> None:
    assert Context().point("<think>maybe ").think
    assert not Context().point("<think>maybe</think> ").think


PIECES = st.sampled_from(
    [
        "Let me check.",
        "word",
        " ",
        "\n",
        "\n\n",
        "```",
        "~~~",
        "`",
        "``",
        "    ",
        "\t",
        "- ",
        "1. ",
        "> ",
        "| ",
        "---|",
        '"',
        '\\"',
        "“",
        "”",
        "„",
        "«",
        "»",
        "<pre>",
        "</pre>",
        "<code>",
        "</code>",
        "<think>",
        "</think>",
        "<|im_end|>",
        "<tool_call>",
        "a < b",
        "<span>",
        ">",
        "x" * 300,
        "y " * 70,
        "好的。",
        ":",
        ".",
    ]
)


@given(parts=st.lists(PIECES, max_size=40), data=st.data())
@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_reading_in_any_pieces_is_reading_the_whole(parts: list[str], data: st.DataObject) -> None:
    text = "".join(parts)
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(text)), max_size=6))))
    pieced = Context()
    for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
        pieced.feed(text[a:b])
        assert pieced.point() == Context().point(text[:b])
    whole = Context().feed(text)
    assert pieced.point() == whole.point()
    assert pieced.feed("\n") == whole.feed("\n")
