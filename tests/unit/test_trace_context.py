"""W3C traceparent: what parses, what formats, and that anything breaking version 00's rules is absent."""

from __future__ import annotations

import re

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
    how = draw(st.sampled_from(["upper", "zero_trace", "zero_span", "short", "long", "sep", "nonhex", "ff", "tail"]))
    if how == "upper":
        ids = trace_id + span_id
        letters = [i for i, c in enumerate(ids) if c in "abcdef"]
        if letters:
            i = draw(st.sampled_from(letters))
            ids = ids[:i] + ids[i].upper() + ids[i + 1 :]
            trace_id, span_id = ids[:32], ids[32:]
        else:
            how = "zero_trace"
    field = {"version": "00", "sep": "-", "trace": trace_id, "span": span_id, "flags": f"{flags:02x}"}
    field |= {
        "upper": {},
        "zero_trace": {"trace": "0" * 32},
        "zero_span": {"span": "0" * 16},
        "short": {"trace": trace_id[:-1]},
        "long": {"span": span_id + "0"},
        "sep": {"sep": "_"},
        "nonhex": {"trace": trace_id[:31] + "g"},
        "ff": {"version": "ff"},
        "tail": {"flags": field["flags"] + "-extra"},  # version 00 has no more fields
    }[how]
    return f"{field['version']}{field['sep']}{field['trace']}-{field['span']}-{field['flags']}"


@given(TRACE_IDS, SPAN_IDS, FLAGS, st.data())
def test_a_header_breaking_one_rule_is_absent(trace_id: str, span_id: str, flags: int, data: st.DataObject) -> None:
    assert parse_traceparent(_broken(trace_id, span_id, flags, data.draw)) is None


# The spec's rules as one expression: the oracle the parser is checked against on near-miss headers.
ORACLE = re.compile(r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}(-.*)?", re.S)


def _field(digits: int) -> st.SearchStrategy[str]:
    """Mostly valid lowercase hex; sometimes all zeros, an uppercase digit, or a digit too few."""
    good = st.text(HEX, min_size=digits, max_size=digits)
    return st.one_of(
        good,
        good,
        good,
        st.just("0" * digits),
        good.map(lambda v: "A" + v[1:]),
        good.map(lambda v: v[1:]),
    )


NEAR_MISSES = st.builds(
    lambda version, trace, span, flags, sep, tail: f"{version}{sep}{trace}-{span}-{flags}{tail}",
    st.sampled_from(["00", "00", "01", "cc", "ff", "0A", "0"]),
    _field(32),
    _field(16),
    st.sampled_from(["01", "00", "ff", "0G", "1"]),
    st.sampled_from(["-", "-", "_"]),
    st.sampled_from(["", "", "-", "-tail", "x"]),
)


VALID = st.builds(format_traceparent, TRACE_IDS, SPAN_IDS, FLAGS)


@given(VALID | NEAR_MISSES | st.text(max_size=80))
def test_a_header_parses_exactly_when_the_spec_says_it_is_valid(text: str) -> None:
    valid = ORACLE.fullmatch(text) is not None and not (text.startswith("00") and len(text) > 55)
    parsed = parse_traceparent(text)
    assert (parsed is not None) is valid, text
    if parsed is not None:
        assert parsed.header()[3:] == text[3:55] and parsed.header().startswith("00-")


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
