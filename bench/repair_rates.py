"""Repair rates per defect class: mutate valid tool-call turns with the defect generator, run them
through the repair stage of each API surface, and count what a strict client receives.

    python bench/repair_rates.py [--examples 100000] [--seed 1] [--show N] [--formats a,b] [--leak-examples N]

Draws `--examples` examples in total from one seeded random.Random, with the same mutation functions
the property tests use (tapfix.proxy.mock.mutations): per example a surface, a composition depth of 1
to 3 and that many distinct defect classes of the surface (those that don't apply to the drawn turn
are left out; an example where none applies is drawn again). Prints, per composition depth and per
class: examples, exact, error, wrong, and `bad` (wrong, plus the error where the composition
preserves the information: there only exact counts). Exits 1 when any example is bad.

The leak into content or reasoning (`leaked_markup`, tapfix.proxy.mock.mutations_leak) gets its own
table, per registered format: the examples of the main draw where it applied, plus `--leak-examples`
more of the leak alone (format drawn uniformly, half the turns narrowed to the one tool their calls
name), each with a decoy of the same format (markup inside a closed `<think>`, inline code, reasoning
followed by content, a name not offered, or an example in prose: the middle of a sentence, quotes, a
list item, a table cell, a blockquote, `<pre>`, indented code, fences; tapfix.proxy.mock.mutations_prose),
which must pass byte for byte; a second table counts the decoys per kind. `--formats` limits the leak
to a comma list of format names.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from tapfix.proxy.mock.defect_run import Example, run_decoy, run_example
from tapfix.proxy.mock.mutations import Mutate, for_surface
from tapfix.proxy.mock.mutations_leak import DECOY_KINDS, FORMATS, leak_into_text, narrowed
from tapfix.proxy.mock.mutations_turns import TurnSource, corpus_turns
from tapfix.proxy.toolcalls.defects import DEFECTS, SURFACES

ROOT = Path(__file__).resolve().parent.parent


def corpus_dir() -> Path:
    shared = ROOT.parent / "shared" / "corpus" / "toolcalls"
    return shared if shared.is_dir() else ROOT / "tests" / "corpus" / "toolcalls"


class Tally:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def add(self, ex: Example) -> None:
        self.counts["examples"] += 1
        self.counts[ex.outcome] += 1
        self.counts["bad"] += not ex.acceptable

    def cells(self) -> str:
        c = self.counts
        return f"{c['examples']:>8} {c['exact']:>8} {c['error']:>8} {c['wrong']:>8} {c['bad']:>6}"


HEAD = f"{'examples':>8} {'exact':>8} {'error':>8} {'wrong':>8} {'bad':>6}"


def draw(rng: random.Random, source: TurnSource, apply: dict[str, Mutate]) -> Example:
    while True:
        surface = rng.choice(SURFACES)
        depth = rng.randint(1, 3)
        ids = [m.id for m in rng.sample(for_surface(surface), depth)]
        ex = run_example(rng, surface, source.draw(rng), ids, apply)
        if ex.applied:
            return ex


class LeakTally:
    """Per format: the leak's examples (alone or composed) and its decoys."""

    def __init__(self) -> None:
        self.leaks: dict[str, Tally] = defaultdict(Tally)
        self.bad_where: dict[str, Counter[str]] = defaultdict(Counter)  # surface/field of bad examples
        self.decoys: Counter[str] = Counter()
        self.changed: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()  # decoys per kind
        self.kinds_changed: Counter[str] = Counter()
        self.failures: dict[str, list[Example]] = defaultdict(list)
        self.decoy_failures: dict[str, list[tuple[str, str, bytes]]] = defaultdict(list)

    def add(self, ex: Example) -> None:
        fmt, where = ex.leak.split(":")
        self.leaks[fmt].add(ex)
        if not ex.acceptable:
            self.bad_where[fmt][f"{ex.surface[0]}/{where[0]}"] += 1
            self.failures[fmt].append(ex)

    def print(self, formats: list[str], show: int) -> None:
        print(f"\n{'leaked_markup per format':<24} {HEAD}   bad at (surface/field)   decoys changed")
        total, decoys, changed = Tally(), 0, 0
        for fmt in formats:
            tally = self.leaks[fmt]
            total.counts.update(tally.counts)
            decoys += self.decoys[fmt]
            changed += self.changed[fmt]
            where = " ".join(f"{k}:{v}" for k, v in sorted(self.bad_where[fmt].items())) or "-"
            print(f"{fmt:<24} {tally.cells()}   {where:<24} {self.decoys[fmt]:>6} {self.changed[fmt]:>7}")
        print(f"{'all':<24} {total.cells()}   {'':<24} {decoys:>6} {changed:>7}")
        print(f"\n{'decoys per kind':<24} {'decoys':>8} {'changed':>8}")
        for kind in DECOY_KINDS:
            print(f"{kind:<24} {self.kinds[kind]:>8} {self.kinds_changed[kind]:>8}")
        if show:
            for fmt in formats:
                for ex in sorted(self.failures[fmt], key=lambda e: len(e.sent))[:show]:
                    print(f"  {fmt} {ex.surface} {ex.leak} {ex.applied}: {ex.outcome} {ex.reason[:200]}")
                for surface, kind, _ in self.decoy_failures[fmt][:show]:
                    print(f"  {fmt} {surface} decoy {kind}: changed")


def leak_alone(rng: random.Random, source: TurnSource, formats: list[str], tally: LeakTally) -> None:
    """One example of the leak alone in a format drawn uniformly, and one decoy of that format."""
    fmt = rng.choice(formats)
    apply = {"leaked_markup": leak_into_text([fmt])}
    for _ in range(20):
        surface = rng.choice(SURFACES)
        turn = source.draw(rng)
        turn = (narrowed(turn) if rng.random() < 0.5 else None) or turn
        ex = run_example(rng, surface, turn, ["leaked_markup"], apply)
        if ex.applied:
            tally.add(ex)
            break
    for _ in range(20):
        surface, kind = rng.choice(SURFACES), rng.choice(DECOY_KINDS)
        decoy = run_decoy(rng, surface, source.draw(rng), fmt, kind)
        if decoy is not None:
            tally.decoys[fmt] += 1
            tally.kinds[kind] += 1
            if not decoy.unchanged:
                tally.changed[fmt] += 1
                tally.kinds_changed[kind] += 1
                tally.decoy_failures[fmt].append((surface, kind, decoy.sent))
            return


def show(ex: Example) -> None:
    print(f"  {ex.surface} {ex.applied} ({ex.source}): {ex.outcome} {ex.reason[:400]}")
    print(f"    fragments as sent: {ex.fragments!r}"[:3000])


def dump(ex: Example) -> dict[str, object]:
    """A bad example as replayable JSON (tapfix.proxy.mock.defect_run.replay reads it)."""
    return {
        "surface": ex.surface,
        "applied": ex.applied,
        "source": ex.source,
        "outcome": ex.outcome,
        "reason": ex.reason,
        "fragments": ex.fragments,
        "tools": ex.tools,
        "expected": ex.expected,
        "sent": ex.sent.decode(),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--show", type=int, default=1, help="failing examples shown per class and surface")
    parser.add_argument("--dump", type=Path, help="write every bad example here, one JSON object a line")
    parser.add_argument("--formats", help="the leak's formats, a comma list (default: every registered one)")
    parser.add_argument("--leak-examples", type=int, help="examples of the leak alone (default: examples / 4)")
    args = parser.parse_args(argv)
    formats = args.formats.split(",") if args.formats else list(FORMATS)
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        parser.error(f"unknown formats {unknown}; registered: {', '.join(FORMATS)}")
    apply = {"leaked_markup": leak_into_text(formats)}
    leak_examples = args.examples // 4 if args.leak_examples is None else args.leak_examples
    leaks = LeakTally()
    rng = random.Random(args.seed)
    source = TurnSource(corpus_turns(corpus_dir()))
    by_depth: dict[int, Tally] = defaultdict(Tally)
    by_class: dict[tuple[str, int], Tally] = defaultdict(Tally)
    by_surface: dict[tuple[str, str], Tally] = defaultdict(Tally)  # depth 1 only
    failures: dict[tuple[str, str], list[Example]] = defaultdict(list)
    total = Tally()
    start = time.process_time()
    for _ in range(args.examples):
        ex = draw(rng, source, apply)
        if ex.leak:
            leaks.add(ex)
        depth = len(ex.applied)
        total.add(ex)
        by_depth[depth].add(ex)
        for cls in ex.applied:
            by_class[(cls, min(depth, 2))].add(ex)
            if depth == 1:
                by_surface[(cls, ex.surface)].add(ex)
        if not ex.acceptable:
            key = (" + ".join(ex.applied), ex.surface)
            failures[key].append(ex)
    elapsed = time.process_time() - start
    for _ in range(leak_examples):
        leak_alone(rng, source, formats, leaks)
    leak_elapsed = time.process_time() - start - elapsed

    print(f"repair rates: {args.examples} examples, seed {args.seed}, {args.examples / elapsed:.0f} examples/s (CPU)")
    print(f"leak: {leak_examples} more examples of the leak alone and as many decoys, {leak_elapsed:.0f} s (CPU)")
    print(f"\n{'depth':<8} {HEAD}")
    for depth in sorted(by_depth):
        print(f"{depth:<8} {by_depth[depth].cells()}")
    print(f"{'all':<8} {total.cells()}")
    print(f"\n{'class':<24} {'alone: ' + HEAD:>52}   {'in compositions: ' + HEAD}")
    for row in DEFECTS:
        alone, composed = by_class[(row.id, 1)], by_class[(row.id, 2)]
        print(f"{row.id:<24} {alone.cells():>52}   {'':>17}{composed.cells()}")
    print(f"\n{'class alone, per surface':<40} {HEAD}")
    for row in DEFECTS:
        for surface in SURFACES:
            if surface in row.outcome:
                tally = by_surface[(row.id, surface)]
                print(f"{row.id + ' ' + surface + ' (' + row.outcome[surface] + ')':<40} {tally.cells()}")
    if failures and args.show:
        print(f"\nfailing examples (the shortest of each composition and surface, {len(failures)} kinds):")
        for key in sorted(failures, key=lambda k: (k[0].count("+"), k)):
            for ex in sorted(failures[key], key=lambda e: len(e.sent))[: args.show]:
                show(ex)
    leaks.print(formats, args.show)
    if args.dump:
        with args.dump.open("w", encoding="utf-8") as f:
            for examples in failures.values():
                for ex in sorted(examples, key=lambda e: len(e.sent)):
                    f.write(json.dumps(dump(ex), ensure_ascii=False) + "\n")
    leak_bad = sum(t.counts["bad"] for t in leaks.leaks.values()) + sum(leaks.changed.values())
    return 1 if total.counts["bad"] or leak_bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
