"""Everything the exchange page shows, gathered from one capture: bodies, diff, changes, timeline.

The request diff is a line diff of the two bodies pretty-printed the same way: tapfix splices keys
into the client's bytes without reordering, so pretty-printing both aligns every unchanged line and
only the spliced keys show. Each change row is turned into a sentence, so the diff is explained.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from tapfix.proxy.browse.charts import StreamTiming, analyze, timeline_svg
from tapfix.proxy.store.answered import answered_by_tapfix, destination, tapfix_error, upstream_error
from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.exchange_row import unpack_timing

if TYPE_CHECKING:
    from tapfix.proxy.store.parts import BrowseQueries
    from tapfix.proxy.store.reader import CaptureReader

PRETTY_LIMIT = 400_000  # characters shown inline; the download links give every byte
DIFF_LINES_LIMIT = 30_000
VERBS = {
    "inject": "added",
    "override": "replaced",
    "clamp": "clamped",
    "drop": "removed",
    "strip_billing_line": "removed Claude Code's billing line at",
    "rename": "renamed",
    "repair": "repaired",
    "detect": "detected (left as is)",
    "normalize": "normalized",
    "map": "mapped",
}
BODIES = ("request", "forwarded", "response", "client_response")


def pretty(body: bytes) -> tuple[str, bool]:
    """(text, truncated): JSON indented in its own key order, anything else as UTF-8 text."""
    if not body:
        return "", False
    try:
        text = orjson.dumps(orjson.loads(body), option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONDecodeError:
        text = body.decode("utf-8", errors="replace")
    if len(text) > PRETTY_LIMIT:
        return text[:PRETTY_LIMIT], True
    return text, False


def line_diff(a: str, b: str) -> list[tuple[str, str]]:
    """[(mark, line)]: mark is ' ', '+', '-' or '@' (a hunk header); context of 3 lines."""
    old, new = a.splitlines(), b.splitlines()
    if len(old) + len(new) > DIFF_LINES_LIMIT:
        return [("@", f"bodies too large to diff inline ({len(old)} and {len(new)} lines): see the changes above")]
    out = []
    for line in difflib.unified_diff(old, new, "as sent", "as forwarded", n=3, lineterm=""):
        if line.startswith(("---", "+++")):
            continue
        out.append((line[0] if line[0] in "+-@" else " ", line[1:] if line[0] in "+- " else line))
    return out


def explain(change: dict[str, Any]) -> str:
    verb = VERBS.get(change["kind"], change["kind"])
    if change["stage"] == "toolcalls":
        return f"tool-call repair ({change['kind']}) at {change.get('path') or '-'}"
    before, after = change.get("before"), change.get("after")
    what = change.get("path") or "-"
    if change["kind"] == "inject" or (before is None and after is not None):
        sentence = f"{change['stage']}: {verb} {what} = {_short(after)} (the client sent none)"
    elif after is None:
        sentence = f"{change['stage']}: {verb} {what} (was {_short(before)})"
    else:
        sentence = f"{change['stage']}: {verb} {what}: {_short(before)} → {_short(after)}"
    return sentence


def _short(value: Any, limit: int = 120) -> str:
    text = orjson.dumps(value).decode()
    return text if len(text) <= limit else text[:limit] + "…"


def as_json(value: Any) -> str:
    """A change's before/after for reading: strings as they are (tool-call arguments are JSON text)."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def export_available() -> bool:
    """The repro bundle comes from `tapfix.proxy.replay.export`, written by another part of tapfix."""
    try:
        return callable(getattr(importlib.import_module("tapfix.proxy.replay.export"), "export_capture", None))
    except Exception:  # noqa: BLE001 - an absent or broken module just hides the link
        return False


@dataclass
class Detail:
    capture: dict[str, Any]
    sent: str = ""
    sent_truncated: bool = False
    forwarded: str | None = None
    diff: list[tuple[str, str]] = field(default_factory=list)
    changes: list[dict[str, Any]] = field(default_factory=list)
    repairs: list[dict[str, Any]] = field(default_factory=list)
    response: str = ""
    response_truncated: bool = False
    client_response_differs: bool = False
    bodies_error: str | None = None
    timing: StreamTiming | None = None
    timeline: str = ""
    downloads: list[tuple[str, str, int]] = field(default_factory=list)  # (which, label, size)
    bundle: bool = False
    replays: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[dict[str, Any]] = field(default_factory=list)  # regeneration attempts made for it
    previous: str | None = None
    next: str | None = None

    @property
    def tapfix_answered(self) -> bool:
        return answered_by_tapfix(self.capture)

    @property
    def destination(self) -> str:
        return destination(self.capture)

    @property
    def error_label(self) -> str:
        """Whose words the error column holds: the engine's, tapfix's own answer's, or the connection's."""
        if upstream_error(self.capture) is not None:
            return "upstream error"
        return "tapfix's error" if tapfix_error(self.capture) is not None else "error"


def load_detail(store: BrowseQueries, capture_id: str) -> Detail:
    with store.reading() as reader:
        capture = reader.load_capture(capture_id)  # raises CaptureNotFound
        d = Detail(capture)
        _bodies(d, reader)
    for change in capture["change_rows"]:
        row = {
            **change,
            "explanation": explain(change),
            "before_json": as_json(change.get("before")),
            "after_json": as_json(change.get("after")),
        }
        d.changes.append(row)
        if change["stage"] == "toolcalls":
            d.repairs.append(row)
    points = unpack_timing(capture.get("chunk_timing"))
    if points:
        d.timing = analyze(
            points,
            ttft_ms=capture.get("first_token_ms"),
            first_byte_ms=capture.get("upstream_first_byte_ms"),
            duration_ms=capture.get("duration_ms"),
            completion_tokens=capture.get("completion_tokens"),
        )
        d.timeline = timeline_svg(points, d.timing)
    d.bundle = export_available() and capture.get("request_body_id") is not None
    d.replays = store.replays_of(capture["id"])
    d.attempts = store.attempts_of(capture["id"])
    d.previous, d.next = store.session_neighbours(capture)
    capture.pop("chunk_timing", None)
    return d


def _bodies(d: Detail, reader: CaptureReader) -> None:
    """The bodies, pretty, with the request diff and the download links; an unreadable one is said once."""
    capture = d.capture
    try:
        request = reader.capture_body(capture, "request")
        d.sent, d.sent_truncated = pretty(request)
        if capture.get("forwarded_body_id"):
            forwarded = reader.capture_body(capture, "forwarded")
            d.forwarded = pretty(forwarded)[0]
            d.diff = line_diff(d.sent, d.forwarded)
        response = reader.capture_body(capture, "response")
        d.response, d.response_truncated = (
            pretty(response)
            if not capture.get("stream")
            else (response.decode("utf-8", errors="replace")[:PRETTY_LIMIT], len(response) > PRETTY_LIMIT)
        )
        d.client_response_differs = bool(capture.get("client_response_body_id"))
        sizes = {
            "request": len(request),
            "forwarded": len(forwarded) if capture.get("forwarded_body_id") else 0,
            "response": len(response),
        }
        labels = {
            "request": "request as sent",
            "forwarded": "request as forwarded",
            "response": "raw upstream response",
            "client_response": "response as the client got it",
        }
        for which in BODIES:
            if which == "forwarded" and not capture.get("forwarded_body_id"):
                continue
            if which == "client_response" and not capture.get("client_response_body_id"):
                continue
            d.downloads.append((which, labels[which], sizes.get(which, -1)))
    except (StoreError, LookupError, ValueError) as e:
        d.bodies_error = str(e)
