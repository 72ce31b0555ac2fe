"""`tapfix check --db LOCATOR`: can the store be reached, and is its schema the one this tapfix writes?

Read-only on both backends: it never creates, migrates or locks anything, so it is safe to point at
a fleet's live database. The schema is told by migration names (each backend records its own):
- up to date: every migration this tapfix knows is applied;
- behind: some are not yet (an older tapfix made it, or nobody wrote yet): the next writer of this
  version applies them, readers read it as it is. No problem;
- ahead: a migration this tapfix doesn't know is applied (a newer tapfix migrated it): this one
  would refuse to write it. A problem, as an unreachable store or someone else's database is.

Each backend fills a `StoreCheck` (`StoreBackend.check`); this module says what it means.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StoreCheck:
    location: str  # masked
    reached: str | None = None  # what answered (PostgreSQL 16.4, a SQLite file); None: unreachable
    problem: str | None = None  # why it can't be used, one line
    applied: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)  # this tapfix's migrations, in order

    @property
    def schema(self) -> str:
        unknown = [name for name in self.applied if name not in self.known]
        if unknown:
            return f"ahead: migration {', '.join(unknown)} is unknown to this tapfix (a newer tapfix migrated it)"
        count = f"{len(set(self.applied) & set(self.known))} of {len(self.known)} migrations"
        pending = [name for name in self.known if name not in self.applied]
        if pending:
            return f"behind ({count}): the next `tapfix run` on it applies {', '.join(pending)}"
        return f"up to date ({count})"

    @property
    def failed(self) -> bool:
        return self.problem is not None or self.schema.startswith("ahead")

    def render(self) -> str:
        mark = "FAIL" if self.failed else "ok  "
        if self.reached is None:
            return f"store    {mark} {self.location}  unreachable: {self.problem}"
        detail = f"{self.reached}; schema {self.schema}"
        return f"store    {mark} {self.location}  {detail}" + (f"; {self.problem}" if self.problem else "")
