"""Stream owner: the only addon that sets `flow.response.stream` (a flow has one stream callable).

It composes the recorder's taps with the response stages (tool-call repair, reasoning-field
rename) in one `StreamPipeline`; plain JSON bodies go through the same stages in `response`.

A compressed answer (an upstream that ignores the stripped Accept-Encoding) is read decoded, and
forwarded as it came unless a stage may change it: then it goes out decoded, Content-Encoding
dropped, recorded as a `framing` change. A stream is decided at its headers (a stage armed), a
whole body after the stages ran (a stage changed it).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import cast

from mitmproxy import ctx, http
from mitmproxy import flow as mitm_flow
from mitmproxy.net.http import http1
from tapfix.addons.runner import body_relay
from tapfix.addons.runner.reset_tail import REPLY_AFTER_ERROR, REPLY_ATTR, TAIL_ATTR
from tapfix.addons.runner.runtime import (
    SHUTDOWN_FLAG,
    SHUTDOWN_MESSAGE,
    Runtime,
    ended_by_attempts,
    ended_normally,
    exchange_of,
)
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses
from tapfix.proxy.changes import Change
from tapfix.proxy.content_encoding import DecodeError, Decoder, codings, decode_whole
from tapfix.proxy.errors import reset_event
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.jsonbody import json_object
from tapfix.proxy.regenerate.records import attempt_records, keep_attempt_records
from tapfix.proxy.regenerate.session import CUT, ENDED, LEFT, SHUTDOWN, AttemptSession
from tapfix.proxy.regenerate.splice import AttemptSplice
from tapfix.proxy.regenerate.whole_body import WHOLE_BODY, BodyOutcome
from tapfix.proxy.request.routing import resolve
from tapfix.proxy.response.pipeline import Stage, StreamPipeline
from tapfix.proxy.response.reasoning_fields import FIELDS, ReasoningFieldRename
from tapfix.proxy.surfaces import Surface, api_surface, is_inference, surface_for
from tapfix.proxy.toolcalls import body_repair_for, stage_for
from tapfix.proxy.toolcalls.chat_stage import ChatToolCallRepair
from tapfix.proxy.toolcalls.evented_stage import HoldingStage
from tapfix.proxy.window.rewrite import FLAG as OVERFLOW_FLAG
from tapfix.proxy.window.rewrite import OverflowEvents
from tapfix.proxy.window.usage import ADDED as USAGE_ADDED
from tapfix.proxy.window.usage import UsageChunkStrip

# The engines that may send an overflow as an error event inside a 200 stream (SGLang's and TabbyAPI's
# streaming handlers, llama.cpp's before it checked the prompt ahead of the headers): only their streams
# are read for one, every other stream stays unsplit.
IN_STREAM_OVERFLOW = ("sglang", "tabbyapi", "llamacpp")

SESSION = "attempt_session"  # ex.extra: the AttemptSession of a stream that may get later attempts
CLIENT_LEFT = "Client disconnected."  # mitmproxy's words for it


def attempt_session(ex: Exchange) -> AttemptSession | None:
    """The attempts of this exchange's stream, when it may get later ones (issue 19)."""
    session = ex.extra.get(SESSION)
    return cast("AttemptSession", session) if session is not None else None


class StreamOwner:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._proxyserver: object | None = None  # mitmproxy's, for the body relay (None in-process without one)

    def running(self) -> None:
        self._proxyserver = ctx.master.addons.get("proxyserver")

    def stages_for(self, ex: Exchange) -> list[Stage]:
        stages: list[Stage] = []
        policy = self.runtime.settings.tool_repair
        surface = surface_for(ex.path)
        if policy != "off" and ex.tools:
            stage = stage_for(
                surface,
                ex.tools,
                policy,
                ex.id,
                self.runtime.settings.stream_valid_prefix,
                tool_choice=ex.tool_choice,
                tool_format=self.tool_format_for(ex),
            )
            if stage is not None:
                ex.extra["toolcalls"] = stage
                stages.append(stage)
        rename = self.rename_for(ex, surface)
        if rename is not None:
            ex.extra["reasoning_rename"] = rename
            stages.append(rename)
        if surface is not None and self.runtime.engine_of(ex.extra.get("target")) in IN_STREAM_OVERFLOW:
            window, prompt_tokens = ex.extra.get("window_hints", (None, None))
            overflow = OverflowEvents(surface, window, prompt_tokens)
            ex.extra["overflow_events"] = overflow
            stages.append(overflow)
        if ex.extra.get(USAGE_ADDED):  # tapfix asked for usage the client didn't: the client doesn't get it
            strip = ex.extra["usage_strip"] = UsageChunkStrip()
            stages.append(strip)
        return stages

    def tool_format_for(self, ex: Exchange) -> str | None:
        """The pinned tool-call format: the routed model's `tool_format`, else `--tool-format` (quick
        mode); None arms every registered format."""
        policy = self.runtime.policy
        if policy is not None and not policy.config.is_quick:
            route = resolve(policy.config, ex.model)
            settings = getattr(route, "settings", None)
            if settings is not None and settings.tool_format is not None:
                return str(settings.tool_format)
        return self.runtime.settings.tool_format

    def rename_for(self, ex: Exchange, surface: Surface | None) -> ReasoningFieldRename | None:
        """The `[reasoning_field]` rename this client wants (chat deltas and messages), if any."""
        if self.runtime.policy is None or api_surface(surface).evented:
            return None
        wanted = self.runtime.policy.config.reasoning_field.for_user_agent(ex.user_agent)
        if wanted not in FIELDS:
            return None
        return ReasoningFieldRename(next(f for f in FIELDS if f != wanted), wanted)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        ex = exchange_of(flow)
        response = flow.response
        if ex is None or response is None or ex.tapfix_answered:
            return  # tapfix's own answer (mitmproxy runs this hook for it too): no upstream head came
        ex.response_started_at = time.perf_counter()
        ex.upstream_status = response.status_code
        response.headers["x-tapfix-capture-id"] = ex.id
        if "text/event-stream" not in response.headers.get("content-type", ""):
            return
        if response.status_code >= 400 and ex.route is not None:
            return  # a routed request's error answer is held whole: another route may answer instead (route_fallback)
        ex.content_type = response.headers.get("content-type", "")
        encoding = response.headers.get("content-encoding", "")
        decoder = None
        readable = True
        if codings(encoding):
            try:
                decoder = Decoder(encoding)
            except DecodeError as e:  # a coding tapfix can't undo: nothing reads the stream
                ex.mark_undecodable(str(e))
                readable = False
        stages = self.stages_for(ex) if response.status_code < 400 and readable else []
        if stages and "content-length" in response.headers:
            length = response.headers.pop("content-length")
            ex.changes.append(
                Change(
                    "framing",
                    "drop",
                    "headers.content-length",
                    length,
                    None,
                    "the stream may change length when repaired; sent chunked instead",
                )
            )
        if stages and decoder is not None:
            self._drop_encoding(ex, response, "the stages read the stream decoded, so the client gets it decoded")
        response.stream = pipeline = StreamPipeline(ex, stages, decoder)
        self._splice(flow, ex, pipeline)
        if self._proxyserver is not None and body_relay.enabled():
            pipeline.after_chunk = body_relay.BodyRelay(flow, pipeline, self._proxyserver).offer

    def _splice(self, flow: http.HTTPFlow, ex: Exchange, pipeline: StreamPipeline) -> None:
        """Issue 19: a stream that may be regenerated gets a splice, which decides at each attempt's end
        whether another follows (addons/attempts.py sends it): a 200 SSE answer to a streamed Chat
        Completions, Responses or Messages POST with tools, one choice, under `--tool-repair error` or
        `fail_fast`, with `--regenerate` above 0, to an upstream of tapfix's own, read by a tool-call stage
        that can defer its verdict, not compressed. Attempt 1 is mitmproxy's own request either way."""
        attempts = self.runtime.attempts
        stage = ex.extra.get("toolcalls")
        response = flow.response
        if (
            attempts is None
            or response is None
            or response.status_code != 200
            or flow.request.method != "POST"
            or not (ex.stream and ex.tools)
            or ex.choices_asked not in (None, 1)
            or not isinstance(ex.extra.get("target"), str)  # regular mode: no upstream of tapfix's own to ask
            or self.runtime.settings.tool_repair not in ("error", "fail_fast")
            or not api_surface(surface_for(ex.path)).turns  # the surfaces whose streams a later attempt can join
            or not isinstance(stage, ChatToolCallRepair | HoldingStage)
            or pipeline.splitter is None
            or pipeline.decoder is not None  # a compressed stream is one attempt
        ):
            return
        settings = self.runtime.regenerate_settings(ex.model)
        if settings.attempts == 0:
            return

        def arm(s: object) -> None:
            if isinstance(s, ChatToolCallRepair | HoldingStage):
                s.defer_fatal, s.defer_unknown_tool = True, settings.unknown_tool

        arm(stage)

        def make_stages() -> list[Stage]:
            stages = self.stages_for(ex)
            for s in stages:
                arm(s)
            return stages

        body = flow.request.raw_content or b""
        target = ex.extra.get("target")
        session = ex.extra[SESSION] = attempts.open()
        pipeline.splice = AttemptSplice(
            session,
            lambda: json_object(body) or {},
            make_stages,
            settings,
            self.runtime.settings.tool_repair,
            engine=self.runtime.engine_of(target),
            admission=self.runtime.admissions.for_upstream(target) if isinstance(target, str) else None,
            surface=surface_for(ex.path) or "chat",
        )
        ex.extra["splice"] = pipeline.splice

    @staticmethod
    def _drop_encoding(ex: Exchange, response: http.Response, reason: str) -> None:
        value = response.headers.pop("content-encoding")
        ex.changes.append(Change("framing", "drop", "headers.content-encoding", value, None, reason))

    @staticmethod
    def collect(ex: Exchange) -> None:
        """The stages' own records (repairs, renames) join the exchange's changes once, at the end."""
        stage = ex.extra.pop("toolcalls", None)
        splice = ex.extra.pop("splice", None)
        if isinstance(splice, AttemptSplice):  # earlier attempts' stages' records come first
            for earlier in splice.stage_history:
                if earlier is not stage:
                    ex.changes.extend(earlier.changes)
        session = ex.extra.pop(SESSION, None)
        if isinstance(session, AttemptSession):
            session.release()
            records = attempt_records(ex, session, splice if isinstance(splice, AttemptSplice) else None)
            keep_attempt_records(ex, records)
        if stage is not None:
            ex.changes.extend(stage.changes)
            # The flag says what the client got: when a later attempt failed and the client got an earlier
            # one's error events, that attempt's verdict (its stage's records are in already).
            answered_by = splice.answered_by if isinstance(splice, AttemptSplice) else None
            outcome = (answered_by or stage).outcome
            if outcome != "untouched":
                ex.flags.add(f"toolcall_{outcome}")
        rename = ex.extra.pop("reasoning_rename", None)
        if rename is not None and (change := rename.change()) is not None:
            ex.changes.append(change)
        strip = ex.extra.pop("usage_strip", None)
        if isinstance(strip, UsageChunkStrip) and (stripped := strip.change()) is not None:
            ex.changes.append(stripped)
        overflow = ex.extra.pop("overflow_events", None)
        if isinstance(overflow, OverflowEvents) and overflow.changes:
            ex.changes.extend(overflow.changes)
            ex.flags.add(OVERFLOW_FLAG)

    def response(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        """A whole body through the stages; a stream's records. A stream whose splice asked for another
        attempt at attempt 1's end returns the coroutine that sends it (mitmproxy awaits what a hook returns):
        the client's response ends only after it. Every other flow pays for no coroutine."""
        ex = exchange_of(flow)
        response = flow.response
        if ex is None or response is None:
            return None
        if response.stream:
            if isinstance(response.stream, StreamPipeline) and response.stream.pending:
                return self._later_attempts(flow, ex, response.stream)
            self.collect(ex)
            return None
        self._whole(ex, response)
        return None

    async def _later_attempts(self, flow: http.HTTPFlow, ex: Exchange, pipeline: StreamPipeline) -> None:
        """Attempt 1 ended and the splice asked for another: the attempts, then what ends the stream."""
        session = attempt_session(ex)
        attempts = self.runtime.attempts
        assert session is not None and attempts is not None
        ending = await attempts.stream(flow, pipeline, session, lambda: SHUTDOWN_FLAG in ex.flags)
        if ending == LEFT:
            session.client_left()
            ex.flags.add("client_disconnected")
            ex.error = ex.error or CLIENT_LEFT
        elif ending in (CUT, SHUTDOWN):
            pipeline.close_splice()
            tail = self._cut_off(ex, pipeline, "the upstream broke off a later attempt")
            await attempts.writer(flow).send(tail or b"")
            if ending == SHUTDOWN:
                ex.error = ex.error or "tapfix shut down before the exchange ended"
            elif not ended_normally(ex):
                ex.flags.add("upstream_reset")
                ex.error = ex.error or "the upstream broke off a later attempt mid-stream"
        self.collect(ex)

    def _whole(self, ex: Exchange, response: http.Response) -> None:
        body = response.raw_content or b""
        if body and response.status_code < 400 and "text/event-stream" in response.headers.get("content-type", ""):
            self._whole_stream(ex, response, body)
            return
        ex.response = body
        ex.content_type = response.headers.get("content-type", "")
        readable = self._decoded(ex, response, body)
        if readable is None or response.status_code >= 400:
            return  # an undecodable body passes as it came; error bodies are never rewritten
        changed = self._body_stages(ex, response, readable)
        if changed is None:
            return  # nothing changed: the upstream's bytes go out, compressed or not
        ex.client_response = changed
        response.raw_content = changed
        if readable is not body:
            self._drop_encoding(ex, response, "a stage changed the decoded body, so the client gets it decoded")
        if "content-length" in response.headers:
            response.headers["content-length"] = str(len(changed))

    def _whole_stream(self, ex: Exchange, response: http.Response, body: bytes) -> None:
        """An event stream that came whole: the answer of the route a streamed request fell over to
        (addons/route_fallback.py reads it plainly). It goes through the stages a stream goes through, recorded
        as a stream is, and on to the client whole."""
        ex.content_type = response.headers.get("content-type", "")
        pipeline = StreamPipeline(ex, self.stages_for(ex))
        sent = _joined(pipeline(body)) + _joined(pipeline(b""))
        self.collect(ex)
        if sent != body:
            response.raw_content = sent
            if "content-length" in response.headers:
                response.headers["content-length"] = str(len(sent))

    @staticmethod
    def _decoded(ex: Exchange, response: http.Response, body: bytes) -> bytes | None:
        """The body with its Content-Encoding undone (None: it can't be); as is when it came plain."""
        encoding = response.headers.get("content-encoding", "")
        if not codings(encoding) or not is_inference(ex.path):
            return body
        try:
            ex.decoded_response = decode_whole(body, encoding)
        except DecodeError as e:
            ex.mark_undecodable(str(e))
            return None
        return ex.decoded_response

    def _body_stages(self, ex: Exchange, response: http.Response, body: bytes) -> bytes | None:
        """Tool-call repair, then the reasoning-field rename, on a whole body; None when nothing changed.
        With regeneration on, the outcome and the way to run the same stages on another attempt's body
        are left for addons/regenerate_body.py (issue 19), which runs after this addon."""
        result = self.body_outcome(ex, body)
        ex.changes.extend(result.changes)
        if result.outcome and result.outcome != "untouched":
            ex.flags.add(f"toolcall_{result.outcome}")
        if result.failed:
            # A server_error 502 makes agents retry the turn; fail_fast is a permanent-looking 4xx.
            response.status_code = 422 if self.runtime.settings.tool_repair == "fail_fast" else 502
        if result.outcome and self.runtime.attempts is not None:
            ex.extra[WHOLE_BODY] = (result, lambda later: self.body_outcome(ex, later))
        return None if result.body is body else result.body

    def body_outcome(self, ex: Exchange, body: bytes) -> BodyOutcome:
        """A whole body through the stages, recording nothing on `ex`: the first attempt's and any later's."""
        out = body
        changes: list[Change] = []
        outcome = ""
        failed = False
        policy = self.runtime.settings.tool_repair
        surface = surface_for(ex.path)
        repair = body_repair_for(surface) if policy != "off" and ex.tools else None
        if repair is not None:
            repaired, repair_changes, outcome = repair(
                out,
                ex.tools,
                capture_id=ex.id,
                policy=policy,
                tool_choice=ex.tool_choice,
                tool_format=self.tool_format_for(ex),
            )
            changes.extend(repair_changes)
            if repaired is not out and repaired != out:
                out = repaired
                failed = outcome == "unrecoverable"
        rename = self.rename_for(ex, surface)
        if rename is not None:
            out, change = rename.rename_body(out)
            if change is not None:
                changes.append(change)
        return BodyOutcome(out, changes, outcome or "", failed)

    def error(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        """Upstream reset mid-stream, or the shutdown grace ended it: flush what the stages hold, then an
        SSE error agents retry. After the stream's terminal event went out, nothing is added. A stream that
        may be regenerated is judged at the cut like at any attempt's end: when the splice asks for another
        attempt, the returned coroutine sends it before mitmproxy ends the client's response."""
        ex = exchange_of(flow)
        response = flow.response
        if ex is not None and response is not None and ex.extra.pop(REPLY_AFTER_ERROR, None):
            self._whole(ex, response)  # another route's answer, in place of the error: sent whole
            setattr(flow.client_conn, REPLY_ATTR, http1.assemble_response(response))
            return None
        if ex is None or response is None or not isinstance(response.stream, StreamPipeline):
            return None
        if flow.error and "client" in flow.error.msg.lower():
            self.collect(ex)
            return None  # nobody is left to tell
        if ended_normally(ex):
            setattr(flow.client_conn, TAIL_ATTR, b"")  # nothing is added, but the body ends cleanly
            self.collect(ex)
            return None
        pipeline = response.stream
        pipeline.cut = True
        if pipeline.splice is not None and SHUTDOWN_FLAG in ex.flags:
            pipeline.close_splice()  # the grace ended it: no other attempt
        held = pipeline.end_of_attempt()
        if pipeline.pending:
            return self._after_cut(flow, ex, pipeline, held)
        tail = self._cut_off(ex, pipeline, flow.error.msg if flow.error else "reset", held)
        if tail is not None:
            setattr(flow.client_conn, TAIL_ATTR, tail)
        self.collect(ex)
        return None

    async def _after_cut(self, flow: http.HTTPFlow, ex: Exchange, pipeline: StreamPipeline, held: list[bytes]) -> None:
        """The upstream cut attempt 1 off and the splice asked for another attempt."""
        session = attempt_session(ex)
        attempts = self.runtime.attempts
        assert session is not None and attempts is not None
        await attempts.writer(flow).send(held)
        ending = await attempts.stream(flow, pipeline, session, lambda: SHUTDOWN_FLAG in ex.flags)
        if ending == ENDED:
            ended_by_attempts(ex)  # the client's stream ended as a later attempt ended it: no reset
            setattr(flow.client_conn, TAIL_ATTR, b"")
        elif ending == LEFT:
            session.client_left()
            flow.error = mitm_flow.Error(CLIENT_LEFT)  # what ended it for the record: the client left
        else:
            pipeline.cut = True
            pipeline.close_splice()
            message = "the upstream broke off a later attempt"
            if (tail := self._cut_off(ex, pipeline, message)) is not None:
                setattr(flow.client_conn, TAIL_ATTR, tail)
        self.collect(ex)

    def _cut_off(
        self, ex: Exchange, pipeline: StreamPipeline, why: str, held: list[bytes] | None = None
    ) -> bytes | None:
        """What ends a stream the upstream broke off (or the shutdown ended): what the stages still held,
        then the retryable error event, unless a stage already ended the stream. None when the client reads
        bytes tapfix can't add to: its connection is then broken off as the upstream's was, so the client
        sees a transport error, never a clean end of a truncated stream."""
        if held is None:
            pipeline.cut = True
            held = pipeline.end_of_attempt()
        tail = b"".join(held)
        if pipeline.passes_encoded or pipeline.broken:
            # The client reads compressed bytes (a plain event would corrupt them), or the pipeline already
            # ended the stream with its own error (it stopped decoding, or stopped being SSE).
            return None
        if tail.rstrip().endswith(b"data: [DONE]"):
            # A stage already ended the stream (a held tool call cut by the reset: its own retryable
            # error event); a second error after [DONE] would only confuse a client.
            return tail
        shutdown = SHUTDOWN_FLAG in ex.flags
        if shutdown:
            message = SHUTDOWN_MESSAGE
        else:
            message = f"upstream server error: the upstream connection broke mid-stream ({why})"
        reason = SHUTDOWN_FLAG if shutdown else "upstream_reset"
        event, error = reset_event(surface_for(ex.path), message, ex.id, reason)
        if ex.client_response_chunks is None:
            ex.client_response_chunks = list(ex.response_chunks)
        ex.client_response_chunks.append(event)
        ex.changes.append(
            Change(
                "stream",
                "inject",
                "$.error",
                None,
                error,
                "tapfix shut down before the stream ended; the client gets a retryable error event"
                if shutdown
                else "the upstream reset mid-stream; the client gets a retryable error event",
            )
        )
        return tail + event


def _joined(out: bytes | list[bytes]) -> bytes:
    return out if isinstance(out, bytes) else b"".join(out)
