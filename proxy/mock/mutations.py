"""The defect generator: one mutation per row of the table of truth (tapfix.proxy.toolcalls.defects).

A mutation is a plain function `(rng, wire) -> wire | None` per API surface where its row has an
outcome (None: the turn has nothing it applies to). It declares whether it preserves the calls'
information, as its row does. Mutations compose: `compose` applies them in a fixed order of phases
(values, escapes, fragments, the arguments' type, then the rendered stream: calls, names, indexes,
ids, finish), so that each one acts on a well-defined form of the wire; a composition destroys
information when any member does. The property tests and bench/repair_rates.py draw from the same
functions.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from tapfix.proxy.mock import mutations_cut as cut
from tapfix.proxy.mock import mutations_frags as frags
from tapfix.proxy.mock import mutations_leak as leak
from tapfix.proxy.mock import mutations_stream as stream
from tapfix.proxy.mock import mutations_text as text
from tapfix.proxy.mock.mutations_wire import Surface, Wire, render
from tapfix.proxy.toolcalls.defects import BY_ID, DEFECTS

Mutate = Callable[[random.Random, Wire], "Wire | None"]
ALL: Final[tuple[Surface, ...]] = ("chat", "responses", "messages")

# In the order they are applied; phase >= RENDERED edits the rendered events.
_ORDER: Final[tuple[tuple[str, Mutate], ...]] = (
    ("scalar_as_string", text.scalar_as_string),
    ("container_as_string", text.container_as_string),
    ("required_missing", text.required_missing),
    ("path_backslashes", text.path_backslashes),
    ("raw_control_characters", text.raw_control_characters),
    ("unescaped_quotes", text.unescaped_quotes),
    ("escaped_whitespace", text.escaped_whitespace),
    ("fragment_duplicated", frags.fragment_duplicated),
    ("fragment_dropped", frags.fragment_dropped),
    ("arguments_cut", frags.arguments_cut),
    ("objects_concatenated", frags.objects_concatenated),
    ("resent_at_finish", frags.resent_at_finish),
    ("args_as_object", frags.args_as_object),
    ("glued_call", cut.glued_call),
    ("leaked_markup", leak.leaked_markup),  # renders the text-only turn itself
    ("leaked_markup_cut", cut.leaked_markup_cut),  # so does this one
    ("two_calls_one_delta", stream.two_calls_one_delta),
    ("unknown_tool", stream.unknown_tool),
    ("name_case", stream.name_case),
    ("name_split", stream.name_split),
    ("name_repeated", stream.name_repeated),
    ("index_gap", stream.index_gap),
    ("index_all_zero", stream.index_all_zero),
    ("index_offset", stream.index_offset),
    ("id_duplicate", stream.id_duplicate),
    ("id_churn", stream.id_churn),
    ("id_missing", stream.id_missing),
    ("finish_stop_with_calls", stream.finish_stop_with_calls),
    ("finish_length_complete", stream.finish_length_complete),
    ("empty_tool_turn", stream.empty_tool_turn),
    ("finish_repeated", cut.finish_repeated),
    ("length_after_calls", cut.length_after_calls),
)
RENDERED: Final = [name for name, _ in _ORDER].index("two_calls_one_delta")

# The leak writes the calls' values as a format's markup: it composes with the mutations of those
# values (before it), not with those of the JSON text or of the structured wire, which it replaces.
_LEAK_COMPOSES: Final = frozenset({"scalar_as_string", "container_as_string", "required_missing"})

# Pairs that together leave a delta with two readings, or contradict each other (the later is skipped).
EXCLUSIVE: Final[frozenset[frozenset[str]]] = frozenset(
    frozenset(p)
    for p in (
        ("index_all_zero", "id_missing"),  # no id: a name on index 0 may start a call or repeat one
        ("index_all_zero", "id_duplicate"),
        ("index_all_zero", "two_calls_one_delta"),  # two open calls on index 0: whose arguments?
        ("finish_stop_with_calls", "finish_length_complete"),
        ("finish_stop_with_calls", "empty_tool_turn"),
        ("finish_length_complete", "empty_tool_turn"),
        ("finish_length_complete", "unknown_tool"),  # no schema says the call is complete
        # A cut (or a dropped tail) right after a bare quote inside a string leaves a string that reads as
        # closed and a lost final `}`: the same text as the repairable parser bug, so undecidable.
        ("unescaped_quotes", "arguments_cut"),
        ("unescaped_quotes", "fragment_dropped"),
        # A glued call leaves the wire one call short: the name mutations number calls as the turn does.
        ("glued_call", "unknown_tool"),
        ("glued_call", "name_case"),
        ("glued_call", "name_split"),
        ("glued_call", "name_repeated"),
        ("length_after_calls", "finish_stop_with_calls"),
        ("length_after_calls", "finish_length_complete"),
        ("length_after_calls", "empty_tool_turn"),
        ("length_after_calls", "finish_repeated"),
    )
) | frozenset(
    frozenset((leaked, name))
    for leaked in ("leaked_markup", "leaked_markup_cut")
    for name, _ in _ORDER
    if name not in _LEAK_COMPOSES | {leaked}
)


@dataclass(frozen=True, slots=True)
class Mutation:
    id: str
    preserves: bool
    order: int
    apply: Mutate
    surfaces: tuple[Surface, ...]


def _build() -> dict[str, Mutation]:
    functions = dict(_ORDER)
    out: dict[str, Mutation] = {}
    names = [name for name, _ in _ORDER]
    for row in DEFECTS:
        fn = functions.get(row.id)
        if fn is None:
            continue
        out[row.id] = Mutation(
            row.id, row.preserves, names.index(row.id), fn, tuple(s for s in ALL if s in row.outcome)
        )
    return out


MUTATIONS: Final[dict[str, Mutation]] = _build()
UNMATCHED: Final = sorted(set(dict(_ORDER)) ^ set(BY_ID))  # empty when rows and mutations agree


def for_surface(surface: Surface) -> list[Mutation]:
    return [m for m in MUTATIONS.values() if surface in m.surfaces]


def compose(rng: random.Random, wire: Wire, ids: Sequence[str], apply: Mapping[str, Mutate] | None = None) -> Wire:
    """`wire` with the mutations `ids` applied in phase order; those that don't apply are left out
    (`wire.applied` lists the ones that did). `apply` replaces a mutation's function (the leak
    limited to some formats: mutations_leak.leak_into_text)."""
    for mutation in sorted((MUTATIONS[i] for i in dict.fromkeys(ids)), key=lambda m: m.order):
        if wire.surface not in mutation.surfaces:
            continue
        if any(frozenset((mutation.id, done)) in EXCLUSIVE for done in wire.applied):
            continue
        if mutation.order >= RENDERED:
            render(wire, rng)
        fn = (apply or {}).get(mutation.id, mutation.apply)
        result = fn(rng, wire.copy())
        if result is not None:
            result.applied.append(mutation.id)
            wire = result
    return wire


def preserves(ids: Sequence[str]) -> bool:
    return all(MUTATIONS[i].preserves for i in ids)
