"""Router: picks the upstream for each request, applies the request policy (model aliases, sampling
defaults, reasoning dialect), and answers locally when forwarding can't work (unknown model,
upstream down, its TLS certificate refused) with JSON errors agents understand — never mitmproxy's
HTML 502."""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import orjson
from mitmproxy import flow as mitm_flow
from mitmproxy import http
from mitmproxy.net.http import http1
from mitmproxy.proxy import server_hooks
from tapfix.addons.runner.http import answer_locally, json_response
from tapfix.addons.runner.reset_tail import REPLY_ATTR
from tapfix.addons.runner.runtime import SHUTDOWN_FLAG, Runtime, exchange_of
from tapfix.addons.runner.script import load as load  # a stock `mitmdump -s` on this file refuses
from tapfix.addons.runner.served import ServedModels
from tapfix.proxy.changes import Change
from tapfix.proxy.config.upstream import UpstreamTarget, authority
from tapfix.proxy.errors import upstream_unreachable
from tapfix.proxy.exchange import Exchange
from tapfix.proxy.http_headers import folded
from tapfix.proxy.jsonbody import note_parse
from tapfix.proxy.request.breaker import Breaker
from tapfix.proxy.request.policy import Outcome
from tapfix.proxy.request.reasoning_replay import REPLAY_MARK, REPLAY_MISSED
from tapfix.proxy.request.routes import Knowledge
from tapfix.proxy.request.routing import models_listing
from tapfix.proxy.request.slots import SLOT_FIELD, SlotPlanner, misspelt_change, slot_request, with_slot
from tapfix.proxy.surfaces import surface_for
from tapfix.proxy.window.clamp import BUDGET_KEY, budget_of

log = logging.getLogger("tapfix")
AFFINITY_KEPT = 10_000  # threads whose upstream is remembered (the oldest forgotten first)
SLOT_KEY = "slot"  # ex.extra: the llama.cpp slot the request was pinned to (request/slots.py `SlotPlan.record`)
_HELD = "slot_held"  # ex.extra: (upstream, slot) counted busy until the exchange ends


class Router:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        config = getattr(runtime.policy, "config", None)
        self.served = ServedModels(config, runtime.settings.insecure) if config is not None else None
        self.routed = self.served.routed_upstreams() if self.served is not None else set()
        s = runtime.settings
        self.breaker = Breaker(s.route_breaker_failures, s.route_breaker_window, s.route_breaker_open)
        self.affinity: OrderedDict[tuple[str, str], str] = OrderedDict()  # (thread, route) → upstream, newest last
        self.slots = SlotPlanner()  # llama.cpp slot pins, per upstream with `slots`

    async def done(self) -> None:
        if self.served is not None:
            await self.served.done()

    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response or flow.error or not flow.live:
            return
        ex = exchange_of(flow)
        if ex is None:  # not recorded (a /tapfix/ path), forwarded as mitmproxy's mode points it
            self._name_the_upstream(flow)
            return
        target = self.runtime.default_target
        if self.runtime.policy is not None:
            if self._answered_locally(flow, ex):
                return
            # One expression: the outcome is gone before the hook awaits again; its parse of the body is noted for
            # the window (jsonbody.shared_parse), which drops it at the end of its own request hook.
            target = self._apply_policy(flow, ex, await self._routed_outcome(flow, ex)) or target
            if flow.response is not None:
                return
        if target is None:  # regular mode: the client chose the host
            self._strip_encoding(flow)
            return
        self._point_at(flow, target)
        self._name_the_upstream(flow)
        ex.upstream_url = f"{target.origin}{flow.request.path}"
        ex.extra["target"] = target.name
        self._strip_encoding(flow)
        why = await self.runtime.unreachable(target)
        if why is not None:
            ex.flags.add("upstream_unreachable")
            error = f"upstream {target.url} unreachable: {why}"
            answer_locally(flow, ex, upstream_unreachable(surface_for(ex.path), error))

    def error(self, flow: http.HTTPFlow) -> None:
        """The upstream connection could not be opened after all: TCP accepted (`unreachable` said yes)
        but TLS failed (a certificate tapfix can't verify), or the upstream went away in between.
        mitmproxy would answer its HTML 502; the client gets the JSON 502 of an unreachable upstream
        instead (agents retry it, clients.md §8), sent by reset_tail in place of that page."""
        ex = exchange_of(flow)
        if ex is not None:
            self.release_slot(ex)
        if flow.response is not None or flow.error is None or flow.server_conn.timestamp_tcp_setup is not None:
            return  # a head went out, or the connection was open: the error is the stream's (addons/stream.py)
        message = flow.error.msg
        if message == mitm_flow.Error.KILLED_MESSAGE or "client" in message.lower():
            return  # ended on purpose (the shutdown grace answers itself), or nobody is left to tell
        if getattr(flow.client_conn, REPLY_ATTR, None) or (ex is not None and SHUTDOWN_FLAG in ex.flags):
            return
        if ex is None and self.runtime.settings.mode != "reverse":
            return  # regular mode, a host tapfix doesn't record: mitmproxy's own answer, as for any proxy
        target = self.runtime.targets.get(ex.extra.get("target", "")) if ex is not None else None
        upstream = target.url if target is not None else self._origin_of(flow.request)
        answer = upstream_unreachable(surface_for(flow.request.path), f"upstream {upstream} unreachable: {message}")
        reply = json_response(answer.status, answer.body, ex.id if ex else None, {"connection": "close"})
        setattr(flow.client_conn, REPLY_ATTR, http1.assemble_response(reply))
        if ex is not None:
            ex.flags.add("upstream_unreachable")
            ex.answered_by_tapfix(answer.error_text())
            ex.status, ex.client_response = answer.status, answer.body

    @staticmethod
    def _origin_of(request: http.Request) -> str:
        return f"{request.scheme}://{authority(request.host, request.port, request.scheme)}"

    def _answered_locally(self, flow: http.HTTPFlow, ex: Exchange) -> bool:
        policy = self.runtime.policy
        if (
            flow.request.method == "GET"
            and not policy.config.is_quick
            and flow.request.path.split("?")[0].rstrip("/").endswith("/models")
        ):
            windows = {key: tokens for key, (tokens, _) in self.runtime.windows.items()}
            answer_locally(flow, ex, (200, orjson.dumps(models_listing(policy.config, windows))))
            return True
        return False

    async def _routed_outcome(self, flow: http.HTTPFlow, ex: Exchange) -> Outcome:
        """The policy's outcome, for a model with routes the first route that can take the request and whose
        upstream accepts a connection (issue 38): one that refuses it (or doesn't connect in time) is
        recorded as an attempt, counts against its circuit breaker, and the next route is tried. Nothing has
        reached the upstream or the client yet, so moving on is safe."""
        request = flow.request
        # A plain dict: the request side reads the headers several times, and each pass over mitmproxy's Headers
        # costs ~40 µs (a multidict lookup per name); built from the raw fields in one pass, as `items()` gives them.
        headers = folded(request.headers.fields)
        return await self.decide_route(ex, request.path, request.raw_content or b"", headers, {}, [])

    async def decide_route(
        self,
        ex: Exchange,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        failed: dict[str, str],
        attempts: list[dict[str, Any]],
        larger_than: int | None = None,
    ) -> Outcome:
        """`_routed_outcome` for a request as given, upstreams in `failed` skipped (addons/route_fallback.py
        asks again after an upstream's error answer)."""
        if self.routed and self.served is not None:
            await self.served.refresh(self.routed)
        while True:
            known = self._knowledge(failed, larger_than)
            outcome: Outcome = self.runtime.policy.apply(path, body, headers, ex.client_addr, known)
            decision = outcome.decision
            if decision is None or decision.taken is None or outcome.upstream is None:
                break
            target = self.runtime.targets.get(outcome.upstream.name)
            why = await self.runtime.unreachable(target) if target is not None else None
            if why is None or target is None:
                break
            failed[decision.taken.upstream] = f"unreachable: {why}"
            self.breaker.failed(decision.taken.upstream, time.monotonic())
            attempts.append({"route": decision.taken.route, "upstream": decision.taken.upstream, "reason": why})
            log.warning("route %s: upstream %s unreachable (%s); next route", decision.taken.route, target.url, why)
        self._pin_slot(ex, headers, outcome)
        if outcome.decision is not None:
            ex.extra["route_decision"] = {**outcome.decision.record(), "attempts": attempts}
            if outcome.decision.taken is not None:
                ex.route = outcome.decision.taken.route
                window = outcome.decision.taken.window
                ex.extra["route_window"] = (window, f"config route {ex.route}") if window else None
            else:
                log.warning("%s", "; ".join(r["reason"] for r in ex.extra["route_decision"]["rejected"]))
        return outcome

    def _pin_slot(self, ex: Exchange, headers: Mapping[str, str], outcome: Outcome) -> None:
        """A request to a llama.cpp upstream with `slots` goes to its thread's slot: `id_slot` added to the body
        the upstream gets (request/slots.py says which surfaces and which slot). A fallback to another upstream
        pins the thread there apart; the slot it left is released."""
        self.release_slot(ex)
        ex.extra.pop(SLOT_KEY, None)
        upstream = outcome.upstream
        if upstream is None or not upstream.slots or outcome.error is not None or not isinstance(outcome.parsed, dict):
            return
        decision = outcome.decision
        thread = decision.facts.thread if decision is not None else None
        request = slot_request(outcome.surface, outcome.parsed, headers, thread)
        if request.misspelt:
            outcome.changes.append(misspelt_change())
            outcome.flags.add("slot_id_ignored")
        plan = self.slots.plan(
            upstream.name, upstream.slots, upstream.reserve_main_slot, outcome.surface, request, time.monotonic()
        )
        if plan is None:
            return
        if plan.slot is not None:
            pinned = with_slot(outcome.body, plan.slot)
            # with_slot writes the member last: what goes out parses to this (unknown if it pins the decoded body)
            sent = {**outcome.sent, SLOT_FIELD: plan.slot} if pinned is not None and outcome.sent is not None else None
            if pinned is None and outcome.decoded is not None:  # it came compressed: it goes upstream decoded
                pinned = with_slot(outcome.decoded, plan.slot)
                if pinned is not None and "content-encoding" not in outcome.remove_headers:
                    outcome.remove_headers.append("content-encoding")
                    coding = next((v for k, v in headers.items() if k.lower() == "content-encoding"), None)
                    why = "id_slot was added to the decoded body; it goes upstream decoded"
                    outcome.changes.append(Change("framing", "drop", "headers.content-encoding", coding, None, why))
            if pinned is None:  # no JSON object's bytes, decoded or not: forwarded as it came, unpinned
                self.slots.release(upstream.name, plan.slot, time.monotonic())
                return
            outcome.body, outcome.sent = pinned, sent
            ex.extra[_HELD] = (upstream.name, plan.slot)
            change = plan.change()
            if change is not None:
                outcome.changes.append(change)
        ex.extra[SLOT_KEY] = plan.record()

    def release_slot(self, ex: Exchange) -> None:
        """The request pinned to a slot ended (or moved to another upstream): the slot is free to be chosen."""
        held = ex.extra.pop(_HELD, None)
        if held is not None:
            self.slots.release(held[0], held[1], time.monotonic())

    def response(self, flow: http.HTTPFlow) -> None:
        ex = exchange_of(flow)
        if ex is not None:
            self.release_slot(ex)

    def _knowledge(self, failed: dict[str, str], larger_than: int | None = None) -> Knowledge:
        reported = {key: tokens for key, (tokens, _) in self.runtime.windows.items()}
        served = self.served
        windows = {**(served.windows if served is not None else {}), **reported}
        return Knowledge(
            environ=os.environ,
            served=served.served if served is not None else {},
            windows=windows,
            failed={**self.breaker.open(time.monotonic()), **failed},
            max_tokens_floor=self.runtime.settings.max_tokens_floor,
            larger_than=larger_than,
            affinity=self.affinity,
        )

    def served_turn(self, ex: Exchange) -> None:
        """The thread's turn was answered by its route's upstream: its next turn goes there first (replicas)."""
        decision = ex.extra.get("route_decision")
        thread = decision.get("inputs", {}).get("thread") if isinstance(decision, dict) else None
        upstream = ex.extra.get("target")
        if not thread or ex.route is None or not isinstance(upstream, str):
            return
        key = (thread, ex.route)
        self.affinity.pop(key, None)
        self.affinity[key] = upstream
        while len(self.affinity) > AFFINITY_KEPT:
            self.affinity.popitem(last=False)

    @staticmethod
    def route_headers(ex: Exchange) -> dict[str, str]:
        """`x-tapfix-route` (the route taken) and `x-tapfix-route-rejected` (`route=why` of those skipped)."""
        decision = ex.extra.get("route_decision")
        if not isinstance(decision, dict):
            return {}
        headers = {"x-tapfix-route": decision["route"] or "none"}
        rejected = [f"{r['route']}={r['kind']}" for r in decision["rejected"]]
        if rejected:
            headers["x-tapfix-route-rejected"] = ", ".join(rejected)
        return headers

    def _apply_policy(self, flow: http.HTTPFlow, ex: Exchange, outcome: Outcome) -> UpstreamTarget | None:
        """Route, fill defaults, rewrite reasoning, as the policy's `outcome` says."""
        if outcome.replay_reasoning:
            ex.extra[REPLAY_MARK] = True  # addons/replay.py remembers the turn this request gets
        if outcome.replay_missed:
            ex.extra[REPLAY_MISSED] = outcome.replay_missed  # for the metrics
        if outcome.surface is not None and flow.request.method == "POST":
            ex.note_request_json(outcome.parsed)
            if isinstance(outcome.parsed, dict):  # the policy never sets a budget: the client's is the one sent
                ex.extra[BUDGET_KEY] = budget_of(outcome.surface, outcome.parsed)
        ex.decoded_request = outcome.decoded
        ex.changes.extend(outcome.changes)
        ex.flags.update(outcome.flags)
        if flow.request.method in ("GET", "HEAD") and not flow.request.raw_content:
            ex.flags.discard("empty_request_body")  # no body by design: nothing to flag
        ex.served_model = outcome.served_model
        if not outcome.store_bodies:
            ex.store_bodies = False  # [models.X] store_bodies = false: metadata only
        if outcome.error is not None:
            answer_locally(flow, ex, outcome.error, self.route_headers(ex))
            return None
        if outcome.body is not flow.request.raw_content:
            flow.request.raw_content = outcome.body
            if "content-length" in flow.request.headers:  # raw_content doesn't update framing
                flow.request.headers["content-length"] = str(len(outcome.body))
        if outcome.sent is not None:  # issue 34: the addons after this one read the body from this parse
            note_parse(ex.extra, outcome.body, outcome.sent)
        for name in outcome.remove_headers:
            flow.request.headers.pop(name, None)
        for name, value in outcome.upstream_headers.items():
            flow.request.headers[name] = value
        return self.runtime.targets.get(outcome.upstream.name) if outcome.upstream is not None else None

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        ex = exchange_of(flow)
        if ex is not None and "target" in ex.extra and flow.response and flow.server_conn.timestamp_start:
            self.runtime.saw_upstream(ex.extra["target"])
            if flow.response.status_code < 500:
                self.breaker.succeeded(ex.extra["target"])
                if flow.response.status_code < 400:
                    self.served_turn(ex)
        if ex is not None and flow.response is not None:
            flow.response.headers.update(self.route_headers(ex))

    def _name_the_upstream(self, flow: http.HTTPFlow) -> None:
        """Reverse mode keeps the client's Host for the record (`keep_host_header`, runner/master.py);
        what goes upstream names the upstream it goes to, as mitmproxy would have: `host[:port]`,
        the scheme's default port left out, an IPv6 address in brackets (mitmproxy's `hostport` leaves
        them out: `::1:8080`). Regular mode: the client's Host already names it."""
        if self.runtime.settings.mode == "reverse":
            request = flow.request
            request.host_header = authority(request.host, request.port, request.scheme)

    def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        """TLS to the upstream names the upstream (SNI), never the name a TLS client gave tapfix:
        with `keep_host_header` mitmproxy would take that one for the mode's own upstream."""
        server = data.server
        if self.runtime.settings.mode == "reverse" and server.sni is not None and server.address:
            server.sni = server.address[0]

    def point_at(self, flow: http.HTTPFlow, target: UpstreamTarget) -> None:
        """Send `flow` to `target` (and name it in Host in reverse mode)."""
        self._point_at(flow, target)
        self._name_the_upstream(flow)

    def _point_at(self, flow: http.HTTPFlow, target: UpstreamTarget) -> None:
        """Each caller names the upstream next (`_name_the_upstream`). In reverse mode that sets Host (and an
        HTTP/2 authority) itself, so a request mitmproxy already points at the target (the default upstream)
        skips the setters, each of which rebuilds and rewrites both (~40 µs a request, issue 34)."""
        request = flow.request
        unchanged = request.scheme == target.scheme and request.host == target.host and request.port == target.port
        if not (unchanged and self.runtime.settings.mode == "reverse"):
            request.scheme = target.scheme
            request.host = target.host
            request.port = target.port
        request.path = target.join(request.path)

    @staticmethod
    def _strip_encoding(flow: http.HTTPFlow) -> None:
        """Ask the upstream for identity: a plain stream is repaired and recorded without a decoding
        step. One that comes compressed anyway is decoded by the stream owner (addons/stream.py)."""
        ex = exchange_of(flow)
        value = flow.request.headers.pop("accept-encoding", None)
        if value is not None and ex is not None:
            ex.changes.append(
                Change(
                    "framing",
                    "drop",
                    "headers.accept-encoding",
                    value,
                    None,
                    "tapfix reads the response; a compressed one would need decoding to be repaired",
                )
            )
