"""Non-streamed regeneration (issue 19): ask the upstream again before a held body reaches the client.

A whole body is held until the `response` hook, and this async hook may await a second upstream request
before mitmproxy sends anything (docs/regenerate.md). The stream owner ran the body stages on attempt 1
and left their outcome (proxy/regenerate/whole_body.py, `WHOLE_BODY`); when it calls for another attempt
and the rules allow one, the attempt goes upstream with the later attempts' client (addons/attempts.py,
`fetch_whole`: the same TLS settings and connect timeout), through the same stages. A good answer
replaces the error the client would have got; when none is good the client gets attempt 1's answer,
as without regeneration. Registered after the stream owner and before the recorder, only with
`--regenerate` above 0.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

from mitmproxy import http
from tapfix.addons.runner.runtime import Runtime, exchange_of
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses
from tapfix.proxy.changes import Change
from tapfix.proxy.content_encoding import DecodeError, codings, decode_whole
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.jsonbody import json_object
from tapfix.proxy.regenerate import wire
from tapfix.proxy.regenerate.records import attempt_records, keep_attempt_records
from tapfix.proxy.regenerate.session import Attempt
from tapfix.proxy.regenerate.whole_body import WHOLE_BODY, BodyOutcome, WholeBodyRegeneration, needs_another
from tapfix.proxy.surfaces import surface_for


class RegenerateBody:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def response(self, flow: http.HTTPFlow) -> None:
        ex = exchange_of(flow)
        response = flow.response
        if ex is None or response is None or response.stream:
            return
        held = ex.extra.pop(WHOLE_BODY, None)
        attempts = self.runtime.attempts
        target = ex.extra.get("target")
        surface = surface_for(ex.path)
        if held is None or attempts is None or not isinstance(target, str) or surface is None:
            return  # no body repair ran, or regular mode (no upstream of tapfix's own to ask again)
        first, stages = held
        settings = self.runtime.regenerate_settings(ex.model)
        if not needs_another(first, settings, self.runtime.settings.tool_repair):
            return
        regen = WholeBodyRegeneration(
            json_object(flow.request.raw_content or b"") or {},
            surface,
            first,
            settings,
            self.runtime.settings.tool_repair,
            engine=self.runtime.engine_of(target),
            admission=self.runtime.admissions.for_upstream(target),
            headers=wire.forwardable(flow.request.headers.items(multi=True)),
        )
        good: BodyOutcome | None = None
        while good is None and (send := regen.plan(client_connected=flow.client_conn.connected)) is not None:
            try:
                fetch = attempts.fetch_whole(send.attempt, flow.request.method, flow.request.url, send.timeout_s)
                await _while_connected(fetch, flow, send.attempt)
            finally:
                if send.ticket is not None:
                    send.ticket.release()
            good = regen.judge(send.attempt, _readable(send.attempt), stages)
        ex.changes.extend(regen.later_changes())  # as a stream's parent holds every attempt's stage records
        if good is not None:
            _answer(ex, response, good)
        if not flow.client_conn.connected:
            # Nothing went out: the answer held for the client (its status and all) never reached it.
            ex.flags.add("client_disconnected")
            ex.error = ex.error or "the client disconnected while the answer was regenerated"
        records = attempt_records(ex, regen, regen)
        keep_attempt_records(ex, records)


def _answer(ex: Exchange, response: http.Response, good: BodyOutcome) -> None:
    """The good attempt's body goes to the client instead of attempt 1's, with status 200."""
    response.status_code, response.reason = 200, "OK"
    response.raw_content = good.body
    if "content-length" in response.headers:
        response.headers["content-length"] = str(len(good.body))
    encoding = response.headers.pop("content-encoding", None)
    if encoding is not None:  # attempt 1 went out as it came; this body is read decoded
        reason = "a regenerated body replaced the upstream's, and it goes out decoded"
        ex.changes.append(Change("framing", "drop", "headers.content-encoding", encoding, None, reason))
    ex.client_response = good.body
    ex.flags -= {f for f in ex.flags if f.startswith("toolcall_")}
    if good.outcome and good.outcome != "untouched":
        ex.flags.add(f"toolcall_{good.outcome}")


def _readable(attempt: Attempt) -> bytes | None:
    """The attempt's body with its Content-Encoding undone (None: it can't be)."""
    body = b"".join(attempt.chunks)
    encoding = wire.header(attempt.headers, "content-encoding") or ""
    if not codings(encoding):
        return body
    try:
        decoded = decode_whole(body, encoding)
    except DecodeError as e:
        attempt.fail(f"the attempt's body can't be decoded: {e}", "undecodable_body")
        return None
    attempt.decoded = [decoded]
    return decoded


async def _while_connected(fetch: Awaitable[None], flow: http.HTTPFlow, attempt: Attempt) -> None:
    """Await the attempt; cancel it when the client leaves (checked every `wire.CLOSE_CHECK_S`)."""
    task = asyncio.ensure_future(fetch)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=wire.CLOSE_CHECK_S)
            if not task.done() and not flow.client_conn.connected:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                attempt.cancel()
                return
        task.result()
    except BaseException:
        task.cancel()
        raise
