"""proxy/regenerate/echo.py: a leading copy of the prefix is stripped only when it is really there."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.regenerate.echo import EchoStrip, PrefixEcho, strip_echo

TEXT = st.text(alphabet="ab\n<>é", max_size=12)


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    pieces, start = [], 0
    for p in points:
        pieces.append(text[start:p])
        start = p
    pieces.append(text[start:])
    return pieces


def _stream(prefix: str, pieces: list[str]) -> tuple[str, bool]:
    strip = EchoStrip(prefix)
    out = "".join(strip.feed(p) for p in pieces) + strip.flush()
    return out, strip.echoed


def test_whole_text_table():
    assert strip_echo("Hello from", "Hello from the model.") == " the model."
    assert strip_echo("Hello from", " the model.") == " the model."  # vLLM, echo false: nothing to strip
    assert strip_echo("Hello from", "Hello fr") == "Hello fr"  # only part of it: the attempt's own text
    assert strip_echo("", "anything") == "anything"
    assert strip_echo("\nHmm.", "Hmm. more") == "Hmm. more"  # the leading newline is part of the prefix


def test_a_prefix_split_across_deltas_and_a_delta_with_prefix_and_new_text():
    strip = EchoStrip("Sure.\n")
    assert [strip.feed(d) for d in ["Su", "re", ".\nI will", " call"]] == ["", "", "I will", " call"]
    assert strip.echoed and strip.flush() == ""


def test_a_departure_releases_what_was_held_in_order():
    strip = EchoStrip("Sure.\n")
    assert [strip.feed(d) for d in ["Su", "n is up"]] == ["", "Sun is up"]
    assert not strip.echoed
    assert strip.feed("Sure.\n") == "Sure.\n"  # decided: later text is never stripped


def test_flush_gives_back_a_partial_match_and_ends_the_watch():
    strip = EchoStrip("Sure.\n")
    assert strip.feed("Sure") == ""
    assert strip.flush() == "Sure"
    assert strip.feed(".\n") == ".\n"


@given(TEXT, TEXT, st.lists(st.integers(min_value=0, max_value=30), max_size=6))
def test_an_echoed_prefix_is_dropped_under_any_split(prefix, new, cuts):
    out, echoed = _stream(prefix, _split(prefix + new, cuts))
    assert out == new
    assert echoed == bool(prefix)


@given(TEXT, TEXT, st.lists(st.integers(min_value=0, max_value=30), max_size=6))
def test_text_without_the_prefix_passes_unchanged_under_any_split(prefix, text, cuts):
    out, echoed = _stream(prefix, _split(text, cuts))
    assert out == strip_echo(prefix, text)
    if not text.startswith(prefix) or not prefix:
        assert out == text and not echoed


def test_prefix_echo_per_field_streamed():
    echo = PrefixEcho({"content": "Sure.\n", "reasoning": "\nHmm."})
    assert echo.feed("reasoning", "\nHmm. The user") == " The user"
    assert echo.feed("content", "Sure") == ""
    assert echo.feed("refusal", "x") == "x"  # a field without a prefix passes
    assert echo.flush() == {"content": "Sure"}  # a tool call follows: the partial match is the attempt's own
    assert echo.echoed == frozenset({"reasoning"})


def test_prefix_echo_whole_message_and_empty_prefixes():
    echo = PrefixEcho({"content": "", "reasoning": "Hmm.\n"})
    assert echo.strip({"content": "Hi", "reasoning": "Hmm.\nmore"}) == {"content": "Hi", "reasoning": "more"}
    assert echo.echoed == frozenset({"reasoning"})
    assert echo.feed("content", "") == ""
