"""Reasoning replay's memory (issue 36): each answered turn of a model that replays reasoning is noted as
its exchange ends, so the agent's next turn finds it before the capture writer has stored it.

After the recorder in the chain: the exchange is whole then (its status, its bodies as the client got them).
"""

from __future__ import annotations

from mitmproxy import http
from tapfix.addons.runner.runtime import Runtime, exchange_of
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses
from tapfix.proxy.request.reasoning_replay import REPLAY_MARK
from tapfix.proxy.store.exchange_row import assemble_answer


class RememberTurns:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def response(self, flow: http.HTTPFlow) -> None:
        self._note(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._note(flow)  # a stream the client had whole, closed after its end, ends here

    def _note(self, flow: http.HTTPFlow) -> None:
        ex = exchange_of(flow)
        turns = self.runtime.replay_turns
        if ex is None or turns is None or ex.extra.pop(REPLAY_MARK, None) is None or ex.error:
            return
        turns.note(ex, assemble_answer(ex, ex.client_response_body(ex.response_body())))
