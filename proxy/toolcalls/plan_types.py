"""What a plan says, and what every tool-call stage records: the calls that go out, the unrecoverable verdict.

The records shared by the planner (`plan.py`), its content half (`plan_content.py`), the writer that
rebuilds a stream from a plan (`output.py`) and every stage, the evented ones too (`Fatal`, `STAGE`).
They stand apart from the planner so both of its halves, and the stages, import them without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from tapfix.proxy.changes import Change

STAGE: Final = "toolcalls"


@dataclass(slots=True)
class OutCall:
    index: int
    id: str
    name: str
    arguments: str
    continued: bool = False  # prefix mode: only the rest of arguments the client already partly has


@dataclass(slots=True)
class Fatal:
    name: str
    reason: str
    kind: str

    def change(self, path: str, reason: str) -> Change:
        """The record of this call not going out as sent (dropped, or replaced by the error)."""
        return Change(STAGE, self.kind, path, {"name": self.name}, None, reason)


QUOTE_LIMIT = 200  # of the engine's message, in the error an agent reads (the store keeps all of it)


def cut_by_upstream_error(message: str) -> str:
    """The reason of a call an engine's error event cut short: the engine's words, quoted, so the
    agent (and its user) read what really happened, not a guess at a broken connection."""
    message = " ".join(message.split())
    if len(message) > QUOTE_LIMIT:
        message = message[:QUOTE_LIMIT] + "…"
    if not message:
        return "the upstream ended the stream with an error before the call was complete"
    return f"the upstream ended the stream with an error before the call was complete: {message}"


@dataclass(slots=True)
class ChoicePlan:
    calls: list[OutCall] = field(default_factory=list)
    structured_clean: bool = True  # upstream tool-call deltas may go out as they came
    content_edits: dict[int, str] = field(default_factory=dict)  # content part -> new text
    changes: list[Change] = field(default_factory=list)
    defects: list[str] = field(default_factory=list)
    fatal: Fatal | None = None
    finish_edit: str | None = None  # the finish_reason the client gets instead of the upstream's

    @property
    def untouched(self) -> bool:
        return self.structured_clean and not self.content_edits and self.fatal is None and self.finish_edit is None

    def defect(self, kind: str) -> None:
        if kind not in self.defects:
            self.defects.append(kind)


@dataclass(slots=True)
class Part:
    seq: int  # position of its event in the stream, to compare with Call.seq
    text: str
