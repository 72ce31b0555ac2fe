"""Repair rates per defect class: mutate valid tool-call turns with the defect generator, run them
through the repair stage of each API surface, and count what a strict client receives.

    python bench/repair_rates.py [--examples 100000] [--seed 1] [--show N]

Draws `--examples` examples in total from one seeded random.Random, with the same mutation functions
the property tests use (tapfix.proxy.mock.mutations): per example a surface, a composition depth of 1
to 3 and that many distinct defect classes of the surface (those that don't apply to the drawn turn
are left out; an example where none applies is drawn again). Prints, per composition depth and per
class: examples, exact, error, wrong, and `bad` (wrong, plus the error where the composition
preserves the information: there only exact counts). Exits 1 when any example is bad.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from tapfix.proxy.mock.defect_run import Example, run_example
from tapfix.proxy.mock.mutations import for_surface
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


def draw(rng: random.Random, source: TurnSource) -> Example:
    while True:
        surface = rng.choice(SURFACES)
        depth = rng.randint(1, 3)
        ids = [m.id for m in rng.sample(for_surface(surface), depth)]
        ex = run_example(rng, surface, source.draw(rng), ids)
        if ex.applied:
            return ex


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
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    source = TurnSource(corpus_turns(corpus_dir()))
    by_depth: dict[int, Tally] = defaultdict(Tally)
    by_class: dict[tuple[str, int], Tally] = defaultdict(Tally)
    by_surface: dict[tuple[str, str], Tally] = defaultdict(Tally)  # depth 1 only
    failures: dict[tuple[str, str], list[Example]] = defaultdict(list)
    total = Tally()
    start = time.process_time()
    for _ in range(args.examples):
        ex = draw(rng, source)
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

    print(f"repair rates: {args.examples} examples, seed {args.seed}, {args.examples / elapsed:.0f} examples/s (CPU)")
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
    if args.dump:
        with args.dump.open("w", encoding="utf-8") as f:
            for examples in failures.values():
                for ex in sorted(examples, key=lambda e: len(e.sent)):
                    f.write(json.dumps(dump(ex), ensure_ascii=False) + "\n")
    return 1 if total.counts["bad"] else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
