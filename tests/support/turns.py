"""Exchanges through a real capture writer, for the telemetry tests: what its observers are told."""

from __future__ import annotations

import json
import queue
from pathlib import Path
from typing import Any

from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.writer import CaptureWriter, Written


class WrittenBy:
    """A real `CaptureWriter`; `write(ex)` returns the `Written` its observer got after the commit."""

    def __init__(self, path: Path) -> None:
        self.writer = CaptureWriter(path)
        self._told: queue.Queue[Written] = queue.Queue()
        self.writer.observers.append(self._told.put)

    def write(self, ex: Exchange) -> Written:
        self.writer.submit(ex)
        return self._told.get(timeout=10)

    def close(self) -> None:
        self.writer.close()


def exchange(path: str, request: dict[str, Any], **fields: Any) -> Exchange:
    """A finished exchange to the upstream `local` (10.0.0.5:8000) that took 0.5 s; `fields` set as given."""
    ex = Exchange(method="POST", path=path, url=f"http://127.0.0.1:8080{path}", request=json.dumps(request).encode())
    ex.upstream_url = f"http://10.0.0.5:8000{path}"
    ex.extra["target"] = "local"
    ex.note_request_json(request)
    for key, value in fields.items():
        setattr(ex, key, value)
    ex.ended_at = ex.mark + 0.5
    return ex
