"""A circuit breaker per upstream (issue 38): an upstream that failed `failures` times within `window_s` is
skipped by the routes for `open_s`, then tried again. A failure is one the routes fall back on (connection
refused, connect timeout); an overflow never counts (the prompt was too long, not the upstream unwell)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

FAILURES = 3
WINDOW_S = 30.0
OPEN_S = 30.0


@dataclass
class Breaker:
    failures: int = FAILURES
    window_s: float = WINDOW_S
    open_s: float = OPEN_S
    _seen: dict[str, deque[float]] = field(default_factory=dict)
    _open_until: dict[str, float] = field(default_factory=dict)

    def failed(self, upstream: str, now: float) -> None:
        seen = self._seen.setdefault(upstream, deque())
        seen.append(now)
        while seen and seen[0] < now - self.window_s:
            seen.popleft()
        if len(seen) >= self.failures:
            self._open_until[upstream] = now + self.open_s
            seen.clear()

    def hold(self, upstream: str, until: float) -> None:
        """Skip `upstream` until `until` (an upstream's own `Retry-After`), however few its failures."""
        self._open_until[upstream] = max(until, self._open_until.get(upstream, 0.0))

    def succeeded(self, upstream: str) -> None:
        self._seen.pop(upstream, None)
        self._open_until.pop(upstream, None)

    def open(self, now: float) -> dict[str, str]:
        """upstream → why it is skipped, for each whose circuit is open at `now`."""
        return {
            name: f"circuit open for {until - now:.0f} s more"
            for name, until in self._open_until.items()
            if until > now
        }
