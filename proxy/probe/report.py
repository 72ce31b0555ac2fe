"""The probe's result: one row per check, an overall verdict, and the table and JSON views of it.

Kept separate from the checks so the proxy's health endpoint can serialize a report without
importing rich, and `tapfix probe --json` prints exactly what `as_dict()` gives.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["pass", "fail", "skip"]


@dataclass(slots=True)
class CheckResult:
    check: str
    status: Status
    ms: float
    detail: str
    model: str | None = None  # the model name the check ran against (config mode: the public name)
    captures: list[str] = field(default_factory=list)  # capture ids of the requests it sent
    data: dict[str, Any] = field(default_factory=dict)  # measurements (ttft_ms, tokens_per_s, ...)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "check": self.check,
            "status": self.status,
            "ms": round(self.ms, 1),
            "detail": self.detail,
        }
        if self.model is not None:
            out["model"] = self.model
        if self.captures:
            out["captures"] = list(self.captures)
        if self.data:
            out["data"] = dict(self.data)
        return out


@dataclass(slots=True)
class ProbeReport:
    target: str  # the server's URL, or the config file
    model: str | None = None  # quick mode: the model probed
    results: list[CheckResult] = field(default_factory=list)
    unreachable: str | None = None  # why nothing could be reached at all (exit code 2)

    @property
    def ok(self) -> bool:
        return self.unreachable is None and all(r.status != "fail" for r in self.results)

    @property
    def exit_code(self) -> int:
        """0 all passed (or skipped), 1 a check failed, 2 the server could not be reached."""
        if self.unreachable is not None:
            return 2
        return 0 if self.ok else 1

    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "fail"]

    def result(self, check: str, model: str | None = None) -> CheckResult | None:
        """The row of one check (and model, in config mode), if it ran."""
        for r in self.results:
            if r.check == check and (model is None or r.model == model):
                return r
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "model": self.model,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "unreachable": self.unreachable,
            "results": [r.as_dict() for r in self.results],
        }


_MARK = {"pass": "[green]pass[/]", "fail": "[bold red]FAIL[/]", "skip": "[yellow]skip[/]"}


def render(report: ProbeReport, width: int | None = None) -> str:
    """The table `tapfix probe` prints (plain text when not on a terminal)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=width or _width(), record=True, force_terminal=False, color_system=None, file=_Null())
    title = escape(f"tapfix probe {report.target}" + (f" — {report.model}" if report.model else ""))
    table = Table(title=title, title_justify="left", show_lines=False)
    with_model = any(r.model and r.model != report.model for r in report.results)
    if with_model:
        table.add_column("model", overflow="fold")
    table.add_column("check")
    table.add_column("result")
    table.add_column("time", justify="right")
    table.add_column("detail", overflow="fold")
    for r in report.results:
        cells = [escape(r.check), _MARK[r.status], _time(r.ms), escape(r.detail)]
        table.add_row(*([escape(r.model or "")] if with_model else []), *cells)
    if report.results:
        console.print(table)
    else:
        console.print(title)
    passed = sum(r.status == "pass" for r in report.results)
    failed = len(report.failed())
    skipped = sum(r.status == "skip" for r in report.results)
    if report.unreachable:
        console.print(f"unreachable: {escape(report.unreachable)}")
    else:
        console.print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()) + "\n"


def _width() -> int:
    """The terminal's width on a terminal; 120 columns in a pipe or a log (a stable layout)."""
    import shutil
    import sys

    return max(80, shutil.get_terminal_size((120, 24)).columns) if sys.stdout.isatty() else 120


def _time(ms: float) -> str:
    return f"{ms:.0f} ms" if ms < 10_000 else f"{ms / 1000:.1f} s"


class _Null(io.StringIO):
    """rich records what it prints; the text is taken with export_text, not written twice."""

    def write(self, text: str) -> int:
        return len(text)
