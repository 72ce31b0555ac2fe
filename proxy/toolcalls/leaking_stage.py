"""What the Responses and Messages stages share of leaked markup: the markup last in a turn's reasoning read
as calls, and calls read out of text emitted as the surface's own items or blocks (`new_calls`, each
surface's). One home, so that the two evented stages can't judge a reasoning leak differently."""

from __future__ import annotations

from typing import Any

from tapfix.proxy.toolcalls.cutoff import cut_off, reasoning_sign
from tapfix.proxy.toolcalls.evented_leaks import LeakDetector, Leaked, leak_change, unpinned_change
from tapfix.proxy.toolcalls.evented_stage import HoldingStage
from tapfix.proxy.vocabulary.repair_policy import ToolRepairPolicy


class LeakingStage(HoldingStage):
    leaks: LeakDetector
    cut_turn: bool  # max_tokens ended the turn (each surface learns it from its own terminal event)

    def __init__(
        self,
        tools: list[Any] | None,
        policy: ToolRepairPolicy = "error",
        capture_id: str = "",
        *,
        tool_format: str | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(tools, policy, capture_id, **kw)
        self.init_leaks(tool_format)
        self.cut_turn = False
        self.texts_before_call = 0  # text parts opened before the last call
        self.init_surface(capture_id)

    def init_leaks(self, tool_format: str | None) -> None:
        raise NotImplementedError  # the surface's holds and leak detector

    def init_surface(self, capture_id: str) -> None:
        raise NotImplementedError  # the surface's own ledger of items or blocks, ids and calls sent

    def new_calls(self, calls: list[tuple[str, str]]) -> list[bytes]:
        raise NotImplementedError  # each surface emits calls as its own items or blocks

    def _flag_format(self, markup: str, where: str) -> None:
        self.add(unpinned_change(markup, where, self.leaks.formats.names), flag=True)

    def _emit_calls(self, leaked: Leaked, where: str, what: str) -> list[bytes]:
        out = self.new_calls(leaked.calls)
        self.add(leak_change(leaked, where, what))
        return out

    def _reasoning_calls(self, out: list[bytes], text: str, where: str) -> list[bytes]:
        """The turn's reasoning, when nothing else of the turn went out: markup last in it becomes calls; a
        call max_tokens cut there is the error, not a call."""
        sign = reasoning_sign(text, self.leaks.schemas, self.leaks.formats) if self.cut_turn and text else None
        if sign is not None:
            return out + self.fatal(cut_off(sign))
        leaked = self.leaks.reasoning(text, where) if text else None
        if leaked is None:
            return out
        if leaked.fatal is not None:
            return out + self.fatal(leaked.fatal)
        for markup in leaked.flagged:
            self._flag_format(markup, where)
        return out + self._emit_calls(leaked, where, "reasoning") if leaked.calls else out
