"""The capture writer's one telemetry observer: each finished exchange becomes a `Turn` once, for every sink.

The metrics' aggregation (`aggregate.py`, which `/tapfix/metrics` and the OTLP metrics export
serve) is always a sink; with OTLP export on, the span exporter is too. They all read the same
`Turn`, built here on the writer thread after the commit (`CaptureWriter.observers`), so no sink
assembles or parses anything again, and the event loop never waits on one. A sink that raises is
counted and logged (once per sink), and the others still run: telemetry must never cost a capture.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from tapfix.proxy.store.writer import Written
from tapfix.proxy.telemetry.config import EXIT_FLUSH_S
from tapfix.proxy.telemetry.turn import Turn, TurnContext, turn_from

log = logging.getLogger("tapfix.telemetry")
Sink = Callable[[Turn], None]


def sink_name(sink: Sink) -> str:
    """A short stable name for health: the class of a recorder, `Class.method` of a bound method."""
    owner = getattr(sink, "__self__", None)
    if owner is not None:
        return f"{type(owner).__name__}.{getattr(sink, '__name__', 'call')}"
    return getattr(sink, "__name__", None) or type(sink).__name__


class TurnFanout:
    """A `CaptureWriter` observer. Add sinks before traffic starts (the writer thread reads the list)."""

    def __init__(self, context: TurnContext, sinks: list[Sink] | None = None) -> None:
        self.context = context
        self.sinks: list[Sink] = list(sinks or [])
        self.turns = 0
        self.turn_errors = 0  # exchanges no Turn could be built for (then no sink saw them)
        self.sink_errors: dict[str, int] = {}
        self._closers: list[Callable[[], None]] = []
        self._logged: set[str] = set()

    def add(self, sink: Sink, *, close: Callable[[], None] | None = None) -> None:
        """A sink, and what flushes it at exit (`close`, after the writer drained)."""
        self.sinks.append(sink)
        if close is not None:
            self.add_closer(close)

    def add_closer(self, close: Callable[[], None]) -> None:
        """What flushes at exit without being a sink (the OTLP metrics read the aggregation, a sink)."""
        self._closers.append(close)

    def __call__(self, written: Written) -> None:
        try:
            turn = turn_from(written, self.context)
        except Exception:  # noqa: BLE001 - never raise into the writer
            self.turn_errors += 1
            self._log_once("turn_from", f"telemetry: no turn for capture {written.exchange.id}")
            return
        self.turns += 1
        for sink in self.sinks:
            try:
                sink(turn)
            except Exception:  # noqa: BLE001 - one sink's bug must not starve the others
                name = sink_name(sink)
                self.sink_errors[name] = self.sink_errors.get(name, 0) + 1
                self._log_once(
                    name, f"telemetry sink {name} failed on capture {turn.capture_id} (counted, not retried)"
                )

    def _log_once(self, key: str, message: str) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.exception("%s; later failures are only counted (/tapfix/health)", message)

    def health(self) -> dict[str, Any]:
        return {"turns": self.turns, "turn_errors": self.turn_errors, "sink_errors": dict(self.sink_errors)}

    def close(self, deadline_s: float = EXIT_FLUSH_S) -> None:
        """After the writer drained (its last observers ran): each sink flushes what it still holds, side by
        side, for at most `deadline_s` in all. A receiver that is down keeps its exporter retrying; its
        daemon thread is then left to end with the process, so Ctrl-C never waits out an export timeout."""

        def flush(close: Callable[[], None]) -> None:
            try:
                close()
            except Exception:  # noqa: BLE001 - exiting anyway; say so once
                log.exception("telemetry: flushing at exit failed")

        threads = [
            threading.Thread(target=flush, args=(c,), name="tapfix-telemetry-flush", daemon=True) for c in self._closers
        ]
        for thread in threads:
            thread.start()
        end = time.monotonic() + deadline_s
        for thread in threads:
            thread.join(max(0.0, end - time.monotonic()))
        if any(t.is_alive() for t in threads):
            log.warning("telemetry: the last export didn't finish within %.0f s; leaving it", deadline_s)
