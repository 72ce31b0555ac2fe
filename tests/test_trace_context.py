"""W3C traceparent: what parses, what formats, and that anything breaking version 00's rules is absent."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.telemetry.context import (
    TraceParent,
    format_traceparent,
    new_span_id,
    new_trace_id,
    parse_traceparent,
    traceparent_of,
)

HEX = "0123456789abcdef"
TRACE_IDS = st.text(HEX, min_size=32, max_size=32).filter(lambda s: s.strip("0"))
SPAN_IDS = st.text(HEX, min_size=16, max_size=16).filter(lambda s: s.strip("0"))
FLAGS = st.integers(0, 255)
W3C_EXAMPLE = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@given(TRACE_IDS, SPAN_IDS, FLAGS)
def test_format_then_parse_gives_the_ids_back(trace_id: str, span_id: str, flags: int) -> None:
    header = format_traceparent(trace_id, span_id, flags)
    assert len(header) == 55 and header.startswith("00-")
    parsed = parse_traceparent(header)
    assert parsed == TraceParent(trace_id, span_id, flags)
    assert parsed.header() == header
    assert parsed.sampled is bool(flags & 1)


@given(TRACE_IDS, SPAN_IDS, FLAGS, st.sampled_from([" ", "\t", "  "]))
def test_optional_whitespace_around_the_value_is_allowed(trace_id: str, span_id: str, flags: int, ws: str) -> None:
    header = format_traceparent(trace_id, span_id, flags)
    assert parse_traceparent(ws + header + ws) == TraceParent(trace_id, span_id, flags)


def _broken(trace_id: str, span_id: str, flags: int, draw: st.DrawFn) -> str:
    """A version-00 header with exactly one rule broken."""
    flags_hex = f"{flags:02x}"
    how = draw(st.sampled_from(["upper", "zero_trace", "zero_span", "short", "long", "sep", "nonhex", "ff", "tail"]))
    if how == "upper":
        letters = [i for i, c in enumerate(trace_id + span_id) if c in "abcdef"]
        if not letters:
            return f"00-{'0' * 32}-{span_id}-{flags_hex}"
        i = draw(st.sampled_from(letters))
        ids = (trace_id + span_id)[:i] + (trace_id + span_id)[i].upper() + (trace_id + span_id)[i + 1 :]
        return f"00-{ids[:32]}-{ids[32:]}-{flags_hex}"
    if how == "zero_trace":
        return f"00-{'0' * 32}-{span_id}-{flags_hex}"
    if how == "zero_span":
        return f"00-{trace_id}-{'0' * 16}-{flags_hex}"
    if how == "short":
        return f"00-{trace_id[:-1]}-{span_id}-{flags_hex}"
    if how == "long":
        return f"00-{trace_id}-{span_id}0-{flags_hex}"
    if how == "sep":
        return f"00_{trace_id}-{span_id}-{flags_hex}"
    if how == "nonhex":
        return f"00-{trace_id[:31]}g-{span_id}-{flags_hex}"
    if how == "ff":
        return f"ff-{trace_id}-{span_id}-{flags_hex}"
    return f"00-{trace_id}-{span_id}-{flags_hex}-extra"  # version 00 has no more fields


@given(TRACE_IDS, SPAN_IDS, FLAGS, st.data())
def test_a_header_breaking_one_rule_is_absent(trace_id: str, span_id: str, flags: int, data: st.DataObject) -> None:
    assert parse_traceparent(_broken(trace_id, span_id, flags, data.draw)) is None


@given(st.text(max_size=80))
def test_arbitrary_text_parses_only_as_a_valid_header(text: str) -> None:
    parsed = parse_traceparent(text)
    if parsed is not None:  # only when it really is one: its own formatting is the text, stripped
        assert text.strip(" \t") == parsed.header()


def test_a_later_version_is_read_by_version_00_rules_and_its_extra_fields_ignored() -> None:
    assert parse_traceparent("01" + W3C_EXAMPLE[2:] + "-what-comes-later") == TraceParent(
        "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1
    )
    assert parse_traceparent("01" + W3C_EXAMPLE[2:] + "x") is None  # extra fields must follow a dash


def test_the_spec_example_and_several_headers() -> None:
    parsed = traceparent_of([W3C_EXAMPLE])
    assert parsed is not None and parsed.sampled and parsed.span_id == "00f067aa0ba902b7"
    assert traceparent_of([]) is None
    assert traceparent_of([W3C_EXAMPLE, W3C_EXAMPLE]) is None  # duplicated: the spec restarts the trace
    assert parse_traceparent(None) is None
    assert parse_traceparent(W3C_EXAMPLE[:-2] + "00").sampled is False  # type: ignore[union-attr]


def test_new_ids_are_valid_and_differ() -> None:
    traces = {new_trace_id() for _ in range(50)}
    spans = {new_span_id() for _ in range(50)}
    assert len(traces) == 50 and len(spans) == 50
    for trace_id, span_id in zip(traces, spans, strict=True):
        assert parse_traceparent(format_traceparent(trace_id, span_id)) == TraceParent(trace_id, span_id, 1)


@pytest.mark.parametrize(
    ("trace_id", "span_id", "flags"),
    [
        ("0" * 32, "1" * 16, 1),
        ("1" * 32, "0" * 16, 1),
        ("A" * 32, "1" * 16, 1),
        ("1" * 31, "1" * 16, 1),
        ("1" * 32, "1" * 16, 256),
    ],
)
def test_format_refuses_what_a_reader_would_refuse(trace_id: str, span_id: str, flags: int) -> None:
    with pytest.raises(ValueError):
        format_traceparent(trace_id, span_id, flags)
