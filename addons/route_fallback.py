"""Route fallback after an upstream's answer (issue 38): a routed request whose upstream answered 5xx or 429 is
sent to the next route that can take it, before any byte of that answer reached the client.

An error answer is held whole until the `response` hook (the stream owner streams no error head of a routed
request: addons/stream.py), so a streamed request falls back too: its error head never reached the client.
The answer that replaces it is read whole (a streamed request's event stream too) and goes to the client whole:
mitmproxy has sent no head yet and can send only one. This addon runs before the stream owner, so that answer
goes through the same stages (tool-call repair, the reasoning field; an event stream through the stream's)
and is recorded as the client's exchange; each failed answer is an exchange of its own (`attempt_of` the
client's capture, `attempt` 2, 3, ...), flagged `route_fallback`. A 4xx other
than 429 is the request's own fault: no fallback. An upstream that answered 429 with a `Retry-After` is
skipped by the routes for that long (at most `RETRY_AFTER_MAX_S`), each failure counts against its breaker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

import httpx
from mitmproxy import ctx, http
from mitmproxy.net.http import http1
from tapfix.addons.runner.http import json_response
from tapfix.addons.runner.reset_tail import REPLY_AFTER_ERROR, REPLY_ATTR
from tapfix.addons.runner.runtime import Runtime, ended_by_attempts, exchange_of
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses
from tapfix.addons.runner.whole_answer import answered_whole, fetch_whole, upstream_client
from tapfix.proxy.changes import Change
from tapfix.proxy.config.upstream import UpstreamTarget
from tapfix.proxy.errors import no_response_head
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.ids import new_capture_id
from tapfix.proxy.jsonbody import json_object
from tapfix.proxy.jsonsplice import Set, SpliceError, splice
from tapfix.proxy.regenerate.records import ATTEMPT_RECORDS
from tapfix.proxy.request.breaker import Breaker
from tapfix.proxy.request.policy import Outcome
from tapfix.proxy.surfaces import surface_for
from tapfix.proxy.window.clamp import budget_of, clamped
from tapfix.proxy.window.overflow import recognise

log = logging.getLogger("tapfix")
RETRY_AFTER_MAX_S = 300.0
FLAG = "route_fallback"
HEAD_TIMER = "head_timer"  # ex.extra: the timer of the upstream's `head_timeout`
NO_HEAD = "no_head"  # ex.extra: why the upstream connection was closed (no head in time)


class Routes(Protocol):
    """What this addon asks of the router (addons/router.py): addons don't import each other."""

    breaker: Breaker

    async def decide_route(
        self,
        ex: Exchange,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        failed: dict[str, str],
        attempts: list[dict[str, Any]],
        larger_than: int | None = None,
    ) -> Outcome: ...

    def point_at(self, flow: http.HTTPFlow, target: UpstreamTarget) -> None: ...

    def route_headers(self, ex: Exchange) -> dict[str, str]: ...

    def served_turn(self, ex: Exchange) -> None: ...

    def release_slot(self, ex: Exchange) -> None: ...


def retryable(status: int) -> bool:
    return status >= 500 or status == 429


def retry_after(value: str | None) -> float | None:
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return min(seconds, RETRY_AFTER_MAX_S) if seconds is not None and seconds > 0 else None


class RouteFallback:
    def __init__(self, runtime: Runtime, router: Routes) -> None:
        self.runtime = runtime
        self.router = router
        self._client: httpx.AsyncClient | None = None
        self._proxyserver: Any = None

    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            settings = self.runtime.settings
            self._client = upstream_client(settings.connect_timeout, not settings.insecure)
        return self._client

    async def done(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def running(self) -> None:
        self._proxyserver = ctx.master.addons.get("proxyserver")

    def request(self, flow: http.HTTPFlow) -> None:
        """The upstream's `head_timeout`, armed once the router pointed the request at its route's upstream."""
        ex = exchange_of(flow)
        if ex is None or flow.response is not None or flow.error is not None or not _routed(ex):
            return
        timeout = self._head_timeout(ex.extra.get("target"))
        if timeout is not None:
            handle = asyncio.get_running_loop().call_later(timeout, self._no_head, flow, timeout)
            ex.extra[HEAD_TIMER] = handle

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        ex = exchange_of(flow)
        if ex is not None and (timer := ex.extra.pop(HEAD_TIMER, None)) is not None:
            timer.cancel()

    def _no_head(self, flow: http.HTTPFlow, timeout: float) -> None:
        """No head came in time: the upstream connection is closed, so mitmproxy's `error` hook runs (below)."""
        ex = exchange_of(flow)
        if ex is None or flow.response is not None or flow.error is not None or not flow.live:
            return
        ex.extra.pop(HEAD_TIMER, None)
        ex.extra[NO_HEAD] = f"sent no response head within {timeout:g} s"
        handler = self._proxyserver.connections.get(flow.client_conn.id) if self._proxyserver else None
        if handler is not None and flow.server_conn in handler.transports:
            handler.close_connection(flow.server_conn)

    async def error(self, flow: http.HTTPFlow) -> None:
        """The upstream connection closed for want of a head: the next route answers instead, whole; the
        stream owner's error hook runs the body stages on it and has it sent in place of mitmproxy's error
        page (an HTTP/1 client's). With no route left the client gets a retryable JSON 504."""
        ex = exchange_of(flow)
        if ex is None:
            return
        if (timer := ex.extra.pop(HEAD_TIMER, None)) is not None:
            timer.cancel()
        reason = ex.extra.pop(NO_HEAD, None)
        if reason is None or flow.response is not None:
            return
        response = await self._fall_over(flow, ex, (reason, None), None)
        if response is not None and flow.response is not None:
            flow.response.headers["connection"] = "close"  # the reply is sent in place of the error, then closed
            ex.extra[REPLY_AFTER_ERROR] = True
            ended_by_attempts(ex)  # the client's answer came whole from the next route: no error of the exchange
            return
        last = ex.extra["route_decision"]["attempts"][-1]  # the route tried last, fallen over to or not
        answer = no_response_head(surface_for(ex.path), f"upstream {last['upstream']} {last['reason']}")
        reply = json_response(
            answer.status, answer.body, ex.id, {"connection": "close", **self.router.route_headers(ex)}
        )
        setattr(flow.client_conn, REPLY_ATTR, http1.assemble_response(reply))
        ex.flags.add("upstream_error")
        ex.answered_by_tapfix(answer.error_text())
        ex.status, ex.client_response = answer.status, answer.body

    async def response(self, flow: http.HTTPFlow) -> None:
        ex = exchange_of(flow)
        response = flow.response
        if ex is None or response is None or response.stream or ex.tapfix_answered or not _routed(ex):
            return
        why = self._why(ex, response)
        if why is not None:
            await self._fall_over(flow, ex, why, response)

    async def _fall_over(
        self, flow: http.HTTPFlow, ex: Exchange, why: tuple[str, int | None] | None, response: http.Response | None
    ) -> http.Response | None:
        """The next routes, in turn, while each fails as `why` says; the answer that stood (None: no head)."""
        decision = ex.extra["route_decision"]
        failed = {a["upstream"]: a["reason"] for a in decision.get("attempts", [])}
        attempts = list(decision.get("attempts", []))
        larger_than: int | None = None
        number = 1
        while why is not None:
            reason, overflowed = why
            upstream = str(ex.extra.get("target"))
            status = response.status_code if response is not None else None
            failed[upstream] = reason
            now = time.monotonic()
            if overflowed is None:  # an overflow says nothing of the upstream's health
                self.router.breaker.failed(upstream, now)
            else:
                larger_than = max(larger_than or 0, overflowed)
            wait = retry_after(response.headers.get("retry-after")) if response is not None and status == 429 else None
            if wait is not None:
                self.router.breaker.hold(upstream, now + wait)
            attempts.append({"route": ex.route, "upstream": upstream, "reason": reason, "status": status})
            number += 1
            ex.extra.setdefault(ATTEMPT_RECORDS, []).append(self._failed_attempt(ex, flow, number, reason))
            before = ex.extra["route_decision"]
            outcome = await self.router.decide_route(
                ex, ex.path, ex.request, dict(ex.request_headers), failed, attempts, larger_than
            )
            taken = outcome.decision.taken if outcome.decision is not None else None
            target = self.runtime.targets.get(outcome.upstream.name) if outcome.upstream is not None else None
            if taken is None or target is None or outcome.error is not None:
                log.warning("route fallback: no other route can take %s after upstream %s %s", ex.id, upstream, reason)
                # the client gets this upstream's answer, as without routes; the decision says what was tried
                others = outcome.decision.record()["rejected"] if outcome.decision is not None else []
                ex.extra["route_decision"] = {**before, "fallback_rejected": others}
                break
            log.warning("route %s: upstream %s %s; next route %s", attempts[-1]["route"], upstream, reason, taken.route)
            self._clamp(ex, outcome)
            try:
                response = await self._send(
                    flow, ex, outcome.body, outcome.upstream_headers, outcome.remove_headers, target
                )
            except (httpx.HTTPError, TimeoutError) as e:
                flow.response = response  # the last route's answer stands (None: none came)
                why_not = str(e) or f"sent no response head within {self._head_timeout(target.name):g} s"
                attempts.append({"route": taken.route, "upstream": taken.upstream, "reason": why_not})
                break
            ex.changes.append(
                Change("router", "fallback", "upstream", upstream, taken.upstream, f"upstream {upstream} {reason}")
            )
            ex.changes += [c for c in outcome.changes if c.path == "$.id_slot"]  # its own slot there (llama.cpp)
            ex.served_model = outcome.served_model
            why = self._why(ex, response)
            if why is None and response.status_code < 400:
                self.router.served_turn(ex)
        ex.extra["route_decision"] = {**ex.extra["route_decision"], "attempts": attempts}
        self.router.release_slot(ex)  # the answer that stands came whole: its slot is done
        ex.flags.add(FLAG)
        if response is not None:
            response.headers.update(self.router.route_headers(ex))
        return response

    def _clamp(self, ex: Exchange, outcome: Outcome) -> None:
        """The new route's window, when known, bounds max_tokens as the window addon bounds a first attempt's:
        the route was found eligible for the prompt plus the clamped budget, so it must be sent clamped (an
        agent's fixed 32000 would otherwise overflow a smaller window the route promised to hold). The prompt
        is the route decision's estimate: the engine isn't asked for a count in the middle of a fallback."""
        decision = outcome.decision
        taken = decision.taken if decision is not None else None
        window = decision.window if decision is not None else None
        budget = budget_of(outcome.surface, outcome.parsed) if isinstance(outcome.parsed, dict) else None
        if decision is None or taken is None or window is None or budget is None:
            return
        key, value = budget
        prompt = decision.facts.prompt_tokens
        new = clamped(value, window, prompt, self.runtime.settings.max_tokens_floor)
        if new is None:
            return
        try:
            outcome.body = splice(outcome.body, [Set((key,), new)], outcome.sent)
            outcome.sent = {**outcome.sent, key: new} if outcome.sent is not None else None
        except SpliceError:
            return  # not a JSON object's bytes (a compressed body): sent as the route's policy made it
        source = decision.facts.prompt_source
        reason = f"route {taken.route}'s {window}-token window less the prompt's {prompt} tokens ({source})"
        ex.changes.append(Change("window", "clamp", f"$.{key}", value, new, f"{reason} leaves {window - prompt}"))

    def _head_timeout(self, upstream: object) -> float | None:
        config = getattr(self.runtime.policy, "config", None)
        declared = config.upstreams.get(upstream) if config is not None and isinstance(upstream, str) else None
        return declared.head_timeout if declared is not None else None

    @staticmethod
    def _why(ex: Exchange, response: http.Response) -> tuple[str, int | None] | None:
        """Why this answer moves the request to another route: (reason, the window an overflow names, else
        None); None when it stands. An overflow moves it only to a strictly larger window (issue 38)."""
        status = response.status_code
        if retryable(status):
            return f"answered {status}", None
        if status != 400:
            return None
        overflow = recognise(json_object(response.raw_content or b""))
        if overflow is None:
            return None
        window = overflow.window or _route_window(ex)
        if window is None:
            return None  # no window to be larger than: the overflow answer stands
        return f"overflowed its window of {window:,} tokens", window

    async def _send(
        self,
        flow: http.HTTPFlow,
        ex: Exchange,
        body: bytes,
        upstream_headers: dict[str, str],
        remove: list[str],
        target: UpstreamTarget,
    ) -> http.Response:
        """The request as the new route's policy made it, from the client's own headers; its answer whole,
        in place of the error."""
        request = flow.request
        request.headers = http.Headers([(k.encode(), v.encode()) for k, v in ex.request_headers])
        for name in [*remove, "accept-encoding"]:
            request.headers.pop(name, None)
        request.headers.update(upstream_headers)
        request.path = ex.path
        request.raw_content = body
        if "content-length" in request.headers:
            request.headers["content-length"] = str(len(body))
        self.router.point_at(flow, target)
        ex.upstream_url = f"{target.origin}{request.path}"
        ex.extra["target"] = target.name
        flow.response = None  # until this route's head came: a route that sends none leaves no answer
        response = await fetch_whole(self.client(), request, ex.upstream_url, body, self._head_timeout(target.name))
        flow.response = response
        answered_whole(ex, response)
        return response

    @staticmethod
    def _failed_attempt(ex: Exchange, flow: http.HTTPFlow, number: int, reason: str) -> Exchange:
        """The error answer a route gave, as an exchange of its own under the client's capture."""
        response = flow.response
        return Exchange(
            id=new_capture_id(),
            started_at=ex.started_at,
            client_addr=ex.client_addr,
            method=ex.method,
            path=ex.path,
            url=ex.url,
            upstream_url=ex.upstream_url,
            user_agent=ex.user_agent,
            model=ex.model,
            served_model=ex.served_model,
            route=ex.route,
            request=flow.request.raw_content or b"",
            request_headers=list(flow.request.headers.items(multi=True)),
            status=response.status_code if response is not None else None,
            upstream_status=response.status_code if response is not None else None,
            response_headers=list(response.headers.items(multi=True)) if response is not None else [],
            content_type=response.headers.get("content-type", "") if response is not None else "",
            response=response.raw_content or b"" if response is not None else b"",
            ended_at=time.perf_counter(),
            error=f"upstream {ex.extra.get('target')} {reason}",
            flags={FLAG},
            attempt_of=ex.id,
            attempt=number,
            store_bodies=ex.store_bodies,
            trace_id=ex.trace_id,
            mark=ex.mark,
        )


def _routed(ex: Exchange) -> bool:
    decision = ex.extra.get("route_decision")
    return isinstance(decision, dict) and decision.get("route") is not None


def _route_window(ex: Exchange) -> int | None:
    """The window the route taken was known to have (its config's), when the engine's error names none."""
    routed = ex.extra.get("route_window")
    return routed[0] if isinstance(routed, tuple) else None
