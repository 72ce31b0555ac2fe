"""Counts already paid for: an agent's next turn is its last prompt plus the reply and what came after, so
its prompt as the chat template writes it starts with the last one's. Counting a 100k-token turn by the
engine costs about a second (bench/README.md, window count); with the earlier prompt's count kept, only the
new suffix is tokenized.

The suffix starts where the earlier prompt ended: after the template's header of the assistant's reply (the
generation prompt). A tokenizer that merged across that point would count a token or two apart from a whole
count, so a sum is marked inexact (`Counted.exact`), and a decision that turns on a few tokens (an overflow
answer) is made on a whole count.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

KEPT = 32  # prompts per upstream and model (an agent's threads at once, each its latest prompt)
MIN_PREFIX = 4096  # characters: a shorter earlier prompt saves too little to be worth the inexact sum


@dataclass(frozen=True, slots=True)
class Counted:
    tokens: int
    exact: bool


class PromptCounts:
    """The token counts of recent templated prompts, by (upstream, served model), newest last."""

    def __init__(self, kept: int = KEPT) -> None:
        self.kept = kept
        self._by_model: dict[tuple[str, str], OrderedDict[str, Counted]] = {}

    def known(self, model: tuple[str, str], prompt: str) -> tuple[str, Counted] | None:
        """The longest kept prompt that `prompt` starts with (itself when it was counted), and its count."""
        best: tuple[str, Counted] | None = None
        for earlier, tokens in self._by_model.get(model, {}).items():
            if (best is None or len(earlier) > len(best[0])) and prompt.startswith(earlier):
                best = (earlier, tokens)
        if best is not None and best[0] != prompt and len(best[0]) < MIN_PREFIX:
            return None
        return best

    def remember(self, model: tuple[str, str], prompt: str, tokens: Counted) -> None:
        kept = self._by_model.setdefault(model, OrderedDict())
        for earlier in [p for p in kept if prompt.startswith(p)]:
            del kept[earlier]  # this thread's earlier prompt: its successor covers it
        kept[prompt] = tokens
        while len(kept) > self.kept:
            kept.popitem(last=False)
