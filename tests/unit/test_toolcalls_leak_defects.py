"""The leak mutation of the defect generator against the repair stages, per surface and per registered
format: a valid turn's calls written as the format's own markup (`fmt.render`) into the content or
last in the reasoning, in deltas cut inside markers and next to multi-byte characters, reach a strict
client as exactly the original calls; the same markup where it is no call (a closed `<think>`, inline
code, reasoning with content after it, a name that isn't offered) reaches it byte for byte.

Fixed hypothesis seed, bounded examples (tapfix.proxy.mock.mutations_leak; bench/repair_rates.py
draws the same mutation in bulk)."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from tapfix.proxy.mock.defect_run import Decoy, Example, run_decoy, run_example
from tapfix.proxy.mock.mutations import MUTATIONS, compose
from tapfix.proxy.mock.mutations_leak import (
    DECOY_KINDS,
    FORMATS,
    hostile_pieces,
    leak_into_text,
    leak_of,
    narrowed,
)
from tapfix.proxy.mock.mutations_turns import Turn
from tapfix.proxy.mock.mutations_wire import new_wire
from tapfix.proxy.sse import SSESplitter, event_data
from tapfix.proxy.toolcalls.defects import SURFACES

from tests.support.depth import examples
from tests.unit.test_toolcalls_defects import BUDGET, SEEDS, SOURCE  # one corpus read, one budget

CASES = [(s, f) for s in SURFACES for f in FORMATS]
IDS = [f"{s}-{f}" for s, f in CASES]
TRIES = 40


def draw(rng: random.Random) -> Turn:
    """A turn; half of those whose calls name one tool offer only it (a format without names can carry them)."""
    turn = SOURCE.draw(rng)
    one = narrowed(turn) if rng.random() < 0.5 else None
    return one or turn


def leaked(rng: random.Random, surface: str, fmt: str) -> Example | None:
    apply = {"leaked_markup": leak_into_text([fmt])}
    for _ in range(TRIES):
        ex = run_example(rng, surface, draw(rng), ["leaked_markup"], apply)  # type: ignore[arg-type]
        if ex.applied == ["leaked_markup"]:
            return ex
    return None


def pieces_of(data: bytes) -> list[tuple[str, str]]:
    """The text deltas of a stream, each as (field, text): what the failure message shows."""
    out = []
    for event in SSESplitter().feed(data):
        payload = event_data(event)
        if payload is None or payload.strip() == b"[DONE]":
            continue
        obj = json.loads(payload)
        for choice in obj.get("choices") or []:
            delta = choice.get("delta") or {}
            out += [(k, delta[k]) for k in ("content", "reasoning_content", "reasoning") if delta.get(k)]
        kind = obj.get("type")
        if kind in ("response.output_text.delta", "response.reasoning_text.delta"):
            out.append((kind.split(".")[1], obj["delta"]))
        elif kind == "content_block_delta":
            out += [(k, obj["delta"][k]) for k in ("text", "thinking") if obj["delta"].get(k)]
        elif kind in ("error", "response.failed") or "error" in obj and "choices" not in obj:
            out.append(("error", json.dumps(obj)[:300]))
    return out


def describe(ex: Example | Decoy) -> str:
    if isinstance(ex, Decoy):
        head = f"{ex.surface} {ex.fmt} decoy {ex.kind} ({ex.source}): changed"
    else:
        head = f"{ex.surface} {ex.leak} ({ex.source}): {ex.outcome} {ex.reason}"
    return f"{head}\nsent:     {_joined(ex.sent)}\nreceived: {_joined(ex.received)}"


def _joined(data: bytes) -> str:
    """The deltas as `field: a|b|c` runs (a `|` is a delta boundary), shortened."""
    runs: list[tuple[str, list[str]]] = []
    for field, text in pieces_of(data):
        if runs and runs[-1][0] == field:
            runs[-1][1].append(text)
        else:
            runs.append((field, [text]))
    shown = " ".join(f"{field}: {'|'.join(texts)!r}" for field, texts in runs)
    return shown if len(shown) < 1600 else shown[:1600] + "…"


def test_the_leak_is_registered_as_preserving_on_every_surface() -> None:
    mutation = MUTATIONS["leaked_markup"]
    assert mutation.preserves and mutation.surfaces == SURFACES


def test_every_registered_format_carries_some_turn() -> None:
    """No format is silently left out of the properties below."""
    rng = random.Random(7)
    lacking = []
    for fmt in FORMATS:
        if leaked(rng, "chat", fmt) is None:
            lacking.append(fmt)
    assert not lacking, f"formats that carried none of {TRIES} drawn turns: {lacking}"


def test_the_markup_leaves_the_structured_wire_and_is_cut_inside_markers() -> None:
    rng = random.Random(3)
    for surface in SURFACES:
        ex = leaked(rng, surface, "deepseek_v31")
        assert ex is not None
        sent = ex.sent.decode()
        assert (
            'tool_calls":[' not in sent
            and "function_call" not in sent
            and 'tool_use"' not in sent.replace('"stop_reason":"tool_use"', "")
        )
        assert ex.leak.startswith("deepseek_v31:")
    pieces = hostile_pieces("Sure. <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>read", random.Random(0))
    assert not any("<｜tool▁calls▁begin｜>" in p for p in pieces) and "".join(pieces).startswith("Sure. <")


def test_escape_and_wire_mutations_do_not_compose_with_the_leak() -> None:
    rng = random.Random(5)
    for _ in range(50):
        turn = SOURCE.draw(rng)
        wire = compose(rng, new_wire("responses", turn, rng), ["leaked_markup", "id_missing", "raw_control_characters"])
        assert "leaked_markup" not in wire.applied or wire.applied == ["leaked_markup"], wire.applied
        assert (leak_of(wire) is not None) == ("leaked_markup" in wire.applied)


@pytest.mark.parametrize(("surface", "fmt"), CASES, ids=IDS)
@settings(max_examples=examples(5), **BUDGET)
@given(seed=SEEDS)
def test_leaked_markup_reaches_the_client_as_exactly_the_calls(surface: str, fmt: str, seed: int) -> None:
    ex = leaked(random.Random(seed), surface, fmt)
    assert ex is not None, f"{fmt} carried none of {TRIES} turns"
    assert ex.outcome == "exact", describe(ex)


@pytest.mark.parametrize(("surface", "fmt"), CASES, ids=IDS)
@settings(max_examples=examples(3), **BUDGET)
@given(seed=SEEDS)
def test_decoy_markup_passes_byte_for_byte(surface: str, fmt: str, seed: int) -> None:
    rng = random.Random(seed)
    for kind in DECOY_KINDS:
        for _ in range(10):
            decoy = run_decoy(rng, surface, draw(rng), fmt, kind)  # type: ignore[arg-type]
            if decoy is not None:
                assert decoy.unchanged, describe(decoy)
                break
