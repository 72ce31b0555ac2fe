"""Release: a finished flow lets go of tapfix's objects (last in the chain).

mitmproxy keeps each connection's layers in reference cycles (a context and its layers), and through
them every flow of the connection, until the cyclic garbage collector finds them. What hung off a flow
went with it: the exchange with its chunks and timings, the stream's pipeline and stages, the splice:
~110 tracked objects a stream, all scanned by a full collection. At 128 agents' streams that made
200 ms pauses of the whole event loop (gen-2 collections of ~86,000 objects), every token in flight
late by as much (issue 34, the stream lane). Once the recorder has handed the exchange to the writer,
nothing reads them from the flow again: dropping the flow's two references frees them at once, by
reference count, and the collector's pauses shrink to mitmproxy's own objects.
"""

from __future__ import annotations

from mitmproxy import http
from tapfix.addons.runner.runtime import META, Runtime
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.response.pipeline import StreamPipeline


class Release:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def response(self, flow: http.HTTPFlow) -> None:
        self._release(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._release(flow)

    @staticmethod
    def _release(flow: http.HTTPFlow) -> None:
        ex = flow.metadata.get(META)
        if not isinstance(ex, Exchange) or ex.ended_at is None:
            return  # not recorded yet (a later hook of this flow still needs it)
        del flow.metadata[META]
        response = flow.response
        if response is not None and isinstance(response.stream, StreamPipeline):
            response.stream.after_chunk = None
            response.stream = True  # streamed, as it was; mitmproxy calls no stream callable after these hooks
