"""The stream pipeline: the one `flow.response.stream` callable of a flow (design: only one owner).

upstream bytes → tap (bytes + arrival time) → SSE split → stages (tool-call repair, reasoning-field
rename, ...) → tap of client-bound bytes. With no stage armed, chunks pass untouched and unsplit.
Stages follow httpx's decoder style: `feed(event) -> [events]`, `flush() -> [events]`.
"""

from __future__ import annotations

import time
from typing import Protocol

from tapfix.proxy.exchange import Exchange
from tapfix.proxy.sse import SSESplitter


class Stage(Protocol):
    def feed(self, event: bytes) -> list[bytes]: ...

    def flush(self) -> list[bytes]: ...


class StreamPipeline:
    __slots__ = ("exchange", "stages", "splitter", "finished", "_clock")

    def __init__(self, exchange: Exchange, stages: list[Stage]) -> None:
        self.exchange = exchange
        self.stages = stages
        self.splitter = SSESplitter() if stages else None
        self.finished = False
        self._clock = time.perf_counter
        if stages:
            exchange.client_response_chunks = []

    def __call__(self, chunk: bytes) -> bytes | list[bytes]:
        """Never returns b"" before the end: mitmproxy would read it as the end of the body."""
        ex = self.exchange
        if chunk:
            ex.response_chunks.append(chunk)
            ex.chunk_times.append(self._clock() - ex.mark)
            if self.splitter is None:
                return chunk
            events = self.splitter.feed(chunk)
            final = False
        else:
            if self.finished:
                return []
            self.finished = True
            if self.splitter is None:
                return []
            events = self.splitter.flush()
            final = True
        for stage in self.stages:
            if len(events) == 1:  # the usual case: one whole event per read
                events = stage.feed(events[0])
            elif events:
                out: list[bytes] = []
                for event in events:
                    out += stage.feed(event)
                events = out
            if final:
                events = events + stage.flush()
        if not events:
            return []
        data = events[0] if len(events) == 1 else b"".join(events)
        assert ex.client_response_chunks is not None
        ex.client_response_chunks.append(data)
        return data
