"""The defect model against the table of truth: every row of tapfix.proxy.toolcalls.defects has a
mutation (and every mutation a row); each mutation alone gives the outcome its row states, on every
surface the row covers; any composition of preserving mutations reaches the client as exactly the
original calls, and one with a destroying mutation ends in the retryable error or exactly the
original calls, never anything else. Valid turns come from the corpus's `expected` calls, the mock's
schema-built arguments and a seeded generator (tapfix.proxy.mock.mutations_turns); the examples are
drawn with a fixed seed and a bounded budget, the same functions bench/repair_rates.py draws from."""

from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from tapfix.proxy.mock.defect_run import Example, applicable_example, run_example
from tapfix.proxy.mock.mutations import MUTATIONS, UNMATCHED, compose, for_surface
from tapfix.proxy.mock.mutations_frags import noise_dropped, quotes_read_leniently
from tapfix.proxy.mock.mutations_text import WINDOWS_PATH, same_value
from tapfix.proxy.mock.mutations_turns import TurnSource, corpus_turns
from tapfix.proxy.mock.mutations_wire import ensure_frags, new_wire
from tapfix.proxy.toolcalls.defects import DEFECTS, SURFACES

from tests.conftest import corpus_dir
from tests.support.depth import examples

SOURCE = TurnSource(corpus_turns(corpus_dir()))
SEEDS = st.integers(0, 2**32 - 1)
# No shrinking: the input is one seed, and the failure message carries the whole example.
BUDGET = {
    "derandomize": True,
    "deadline": None,
    "phases": (Phase.explicit, Phase.generate),
    "suppress_health_check": (HealthCheck.filter_too_much, HealthCheck.too_slow),
}
EXPECTED = {"repaired": ("exact",), "passed": ("exact",), "detected": ("error",)}
ROWS = [(s, d.id) for d in DEFECTS for s in SURFACES if s in d.outcome]


def describe(ex: Example) -> str:
    sent = ex.sent.decode(errors="replace")
    return (
        f"{ex.surface} {ex.applied} ({ex.source}): {ex.outcome} {ex.reason}\n"
        f"fragments as sent: {ex.fragments!r}\n--- sent ---\n{sent[-4000:]}"
    )


def test_every_row_has_a_mutation_and_every_mutation_a_row() -> None:
    assert UNMATCHED == []
    for row in DEFECTS:
        mutation = MUTATIONS[row.id]
        assert mutation.preserves == row.preserves, row.id
        assert mutation.surfaces == tuple(s for s in SURFACES if s in row.outcome), row.id


@pytest.mark.parametrize("surface", SURFACES)
@settings(max_examples=examples(100), **BUDGET)
@given(seed=SEEDS)
def test_a_valid_turn_passes_byte_for_byte(surface, seed) -> None:
    rng = random.Random(seed)
    ex = run_example(rng, surface, SOURCE.draw(rng), [])
    assert ex.applied == []
    assert ex.received == ex.sent, describe(ex)
    assert ex.outcome == "exact", describe(ex)


@pytest.mark.parametrize(("surface", "row"), ROWS, ids=[f"{s}-{r}" for s, r in ROWS])
@settings(max_examples=examples(30), **BUDGET)
@given(seed=SEEDS)
def test_each_defect_alone_gets_its_rows_outcome(surface, row, seed) -> None:
    rng = random.Random(seed)
    ex = applicable_example(rng, surface, SOURCE.draw, [row])
    assume(ex is not None)
    assert ex is not None
    outcome = next(d.outcome[surface] for d in DEFECTS if d.id == row)
    assert ex.outcome in EXPECTED[outcome], describe(ex)


@pytest.mark.parametrize("depth", [2, 3])
@pytest.mark.parametrize("surface", SURFACES)
@settings(max_examples=examples(150), **BUDGET)
@given(seed=SEEDS)
def test_compositions_are_exact_or_the_error_never_wrong(surface, depth, seed) -> None:
    rng = random.Random(seed)
    ids = [m.id for m in rng.sample(for_surface(surface), depth)]
    ex = run_example(rng, surface, SOURCE.draw(rng), ids)
    assume(len(ex.applied) >= 2)
    assert ex.acceptable, describe(ex)


_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"', re.S)


def _paths_read_literally(text: str) -> str:
    """The reading path_backslashes relies on: a string that is a Windows/UNC path and doesn't read
    as JSON without control characters is its characters as written."""

    def fix(m: re.Match[str]) -> str:
        raw = m.group(1)
        try:
            decoded = json.loads(m.group())
        except ValueError:
            decoded = None
        plausible = isinstance(decoded, str) and not any(ord(c) < 0x20 for c in decoded)
        return json.dumps(raw) if WINDOWS_PATH.fullmatch(raw) and not plausible else m.group()

    return _STRING.sub(fix, text)


# A reference reading per escape mutation: what makes it information-preserving, checked on the
# generator's own output (a mutation that lost information would fail here, not in the repair).
REFERENCE_READINGS = {
    "raw_control_characters": lambda text: json.loads(text, strict=False),
    "unescaped_quotes": lambda text: json.loads(quotes_read_leniently(text)),
    "escaped_whitespace": lambda text: json.loads(noise_dropped(text)),
    "path_backslashes": lambda text: json.loads(_paths_read_literally(text)),
    "resent_at_finish": None,  # the last fragment is the whole arguments
}


@pytest.mark.parametrize("mutation", sorted(REFERENCE_READINGS))
@settings(max_examples=examples(60), **BUDGET)
@given(seed=SEEDS)
def test_preserving_mutations_keep_a_reading_that_gives_the_original(mutation, seed) -> None:
    rng = random.Random(seed)
    turn = SOURCE.draw(rng)
    wire = compose(rng, new_wire("chat", turn, rng), [mutation])
    assume(wire.applied == [mutation])
    reading = REFERENCE_READINGS[mutation]
    for sent, call in zip(wire.calls, turn.calls, strict=True):
        frags = ensure_frags(sent, rng)
        resent = reading is None and mutation in sent.applied
        text = frags[-1] if resent else "".join(frags)
        value = json.loads(text) if reading is None else reading(text)
        assert same_value(value, call.arguments), (mutation, frags)


# Mutations whose stream is still well formed by the Chat Completions spec (the rows' "as sent, when
# already well formed"): invariant 1 says they pass byte for byte.
SPEC_VALID = ("two_calls_one_delta", "name_split")


@pytest.mark.parametrize("mutation", SPEC_VALID)
@settings(max_examples=examples(30), **BUDGET)
@given(seed=SEEDS)
def test_a_well_formed_stream_a_mutation_leaves_valid_passes_byte_for_byte(mutation, seed) -> None:
    rng = random.Random(seed)
    ex = applicable_example(rng, "chat", SOURCE.draw, [mutation])
    assume(ex is not None)
    assert ex is not None
    assert ex.received == ex.sent, describe(ex)
