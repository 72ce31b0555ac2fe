"""Which route a request takes (issue 38): the routes whose `when` matches, in the file's order, then the
model's default upstream; the first that can take the request wins, and the decision says why.

A route that can't take a request is never taken silently: no credential, a model its upstream doesn't
serve, a window the prompt plus the clamped output budget doesn't fit, a need (tools, images, reasoning) it
doesn't declare, or an upstream that just failed. When none can, the client is told each route and why
(never an environment variable's name: the capture and the log get those).

Pure: what the upstreams serve, their windows and which failed are handed in (`Knowledge`); the router
addon keeps them (addons/router.py). Token counts are the request's own estimate here (`facts_of`); a
prompt is never sent anywhere to be counted for routing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from tapfix.proxy.config.file import Config, ModelConfig
from tapfix.proxy.config.routes import DEFAULT_ROUTE, RouteRule, When, glob_match
from tapfix.proxy.errors import LocalAnswer, context_overflow, no_eligible_route, overflow_message
from tapfix.proxy.http_headers import SESSION_HEADERS
from tapfix.proxy.surfaces import Surface, api_surface
from tapfix.proxy.window.clamp import budget_of, chat_messages

BYTES_PER_TOKEN = 4  # the estimate: about four bytes of prompt JSON a token (English text and code)
_IMAGE_PARTS = frozenset({"image_url", "image", "input_image"})


@dataclass(frozen=True, slots=True)
class Facts:
    """What the rules and the eligibility checks read from one request."""

    model: str
    prompt_tokens: int
    prompt_source: str  # "estimate" (bytes / 4) or where a count came from
    max_tokens: int | None = None
    needs: tuple[str, ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict)  # lowercased names
    user_agent: str = ""
    thread: str | None = None  # the conversation this turn continues (`thread_of`), for replica affinity


def thread_of(messages: list[Any], headers: Mapping[str, str]) -> str | None:
    """A key for the conversation a request belongs to, the same on each of its turns: the agent's session
    header (if any) and its first two messages (the system prompt and the task), hashed. Subagents of one
    session start with other messages, so they are threads of their own."""
    if not messages:
        return None
    session = next((headers[h] for h in SESSION_HEADERS if h in headers), "")
    try:
        key = orjson.dumps([session, messages[:2]], option=orjson.OPT_SORT_KEYS)
    except TypeError:  # what orjson refuses (see `_size`)
        key = json.dumps([session, messages[:2]], sort_keys=True, default=str).encode()
    digest = hashlib.sha256(key).hexdigest()
    return digest[:16]


def facts_of(surface: Surface | None, parsed: Mapping[str, Any], headers: Mapping[str, str], model: str) -> Facts:
    lowered = {k.lower(): v for k, v in headers.items()}
    messages = chat_messages(surface, dict(parsed)) or []
    prompt = _size([messages, parsed.get("tools") or []])
    budget = budget_of(surface, dict(parsed))
    return Facts(
        model=model,
        prompt_tokens=-(-prompt // BYTES_PER_TOKEN),
        prompt_source=f"estimate, {BYTES_PER_TOKEN} bytes a token",
        max_tokens=budget[1] if budget else None,
        needs=needs_of(parsed, messages),
        headers=lowered,
        user_agent=lowered.get("user-agent", ""),
        thread=thread_of(messages, lowered),
    )


def _size(value: Any) -> int:
    """Its JSON's length in bytes; what orjson refuses (a lone surrogate, an integer past 64 bits) json writes."""
    try:
        return len(orjson.dumps(value))
    except TypeError:
        return len(json.dumps(value, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass"))


def needs_of(parsed: Mapping[str, Any], messages: list[Any]) -> tuple[str, ...]:
    """tools: the request offers any; images: a message carries one; reasoning: it asks for thinking."""
    found = []
    if isinstance(parsed.get("tools"), list) and parsed["tools"]:
        found.append("tools")
    if any(_has_image(m) for m in messages):
        found.append("images")
    effort = parsed.get("reasoning_effort")
    reasoning = parsed.get("reasoning")
    thinking = parsed.get("thinking")
    if (
        (isinstance(effort, str) and effort not in ("none", ""))
        or (isinstance(reasoning, dict) and reasoning.get("effort") not in (None, "none"))
        or (isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"))
    ):
        found.append("reasoning")
    return tuple(found)


def _has_image(message: Any) -> bool:
    content = message.get("content") if isinstance(message, dict) else None
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") in _IMAGE_PARTS for p in content)


def matches(when: When, facts: Facts) -> bool:
    if when.prompt_tokens_over is not None and not facts.prompt_tokens > when.prompt_tokens_over:
        return False
    if when.prompt_tokens_under is not None and not facts.prompt_tokens < when.prompt_tokens_under:
        return False
    for name, pattern in when.header.items():
        if name not in facts.headers or not glob_match(pattern, facts.headers[name]):
            return False
    if when.user_agent is not None and not glob_match(when.user_agent, facts.user_agent):
        return False
    if when.model is not None and not glob_match(when.model, facts.model):
        return False
    return all(n in facts.needs for n in when.needs)


@dataclass(frozen=True, slots=True)
class Candidate:
    route: str  # the rule's name, or "default"
    upstream: str
    served_model: str
    window: int | None  # the config's; None: the engine's, if known
    supports: tuple[str, ...] | None
    rule: RouteRule | None = None  # None: the default

    @property
    def label(self) -> str:
        return self.route


def candidates(
    config: Config, model: ModelConfig, served: str, facts: Facts, affinity: Mapping[tuple[str, str], str] | None = None
) -> list[Candidate]:
    """The matching routes in order, then the model's own upstream. A route's replicas are in their order, but
    the one that served this thread's previous turn first (its KV cache is there): affinity orders replicas
    within the route a rule chose, never which rule."""
    found = []
    for rule in model.routes:
        if not matches(rule.when, facts):
            continue
        preferred = (affinity or {}).get((facts.thread, rule.name)) if facts.thread else None
        for upstream in sorted(rule.upstreams, key=lambda u: u != preferred):
            supports = rule.supports or model.supports or config.upstreams[upstream].supports
            found.append(
                Candidate(rule.name, upstream, rule.upstream_model or served, rule.context_window, supports, rule)
            )
    own = model.supports or config.upstreams[model.upstream].supports
    found.append(Candidate(DEFAULT_ROUTE, model.upstream, served, model.context_window, own))
    return found


@dataclass(frozen=True, slots=True)
class Knowledge:
    """What the proxy knows of its upstreams at this moment (the router addon keeps it)."""

    environ: Mapping[str, str] = field(default_factory=dict)
    served: Mapping[str, frozenset[str]] = field(default_factory=dict)  # upstream → ids; absent: not known
    windows: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (upstream, served) → the engine's
    failed: Mapping[str, str] = field(default_factory=dict)  # upstream → why it is skipped now
    max_tokens_floor: int = 256
    larger_than: int | None = None  # an engine said the prompt overflowed this window: only larger ones now
    affinity: Mapping[tuple[str, str], str] = field(default_factory=dict)  # (thread, route) → its last upstream


@dataclass(frozen=True, slots=True)
class Rejection:
    kind: str  # credential | served | window | needs | failed
    message: str  # for the client: never an environment variable
    detail: str  # for the capture, the log and `tapfix check`
    window: int | None = None


def window_of(c: Candidate, known: Knowledge) -> int | None:
    """A candidate's window as eligibility judges it: the config's, else what its engine told."""
    return c.window or known.windows.get((c.upstream, c.served_model))


def rejection(config: Config, c: Candidate, facts: Facts, known: Knowledge) -> Rejection | None:
    """Why `c` can't take this request, or None when it can."""
    upstream = config.upstreams[c.upstream]
    if upstream.api_key_env and not known.environ.get(upstream.api_key_env):
        said = f"no credential for upstream {c.upstream}"
        return Rejection("credential", said, f"{said} ({upstream.api_key_env} is not set)")
    if c.upstream in known.failed:
        said = f"upstream {c.upstream} failed"
        return Rejection("failed", said, f"{said}: {known.failed[c.upstream]}")
    served = known.served.get(c.upstream)
    if served is not None and c.served_model not in served:
        said = f"upstream {c.upstream} does not serve {c.served_model}"
        return Rejection("served", said, f"{said} (it serves {', '.join(sorted(served)) or 'nothing'})")
    missing = [n for n in facts.needs if c.supports is not None and n not in c.supports]
    if missing:
        said = f"upstream {c.upstream} does not support {', '.join(missing)}"
        return Rejection("needs", said, said)
    window = window_of(c, known)
    if known.larger_than is not None and (window is None or window <= known.larger_than):
        size = f"window {window:,}" if window is not None else "its window is unknown,"
        said = f"{size} not larger than the {known.larger_than:,} the prompt overflowed"
        return Rejection("window", said, said, window)
    if window is not None:
        output = min(facts.max_tokens, known.max_tokens_floor) if facts.max_tokens else 0
        if facts.prompt_tokens + output > window:
            if output and facts.prompt_tokens <= window:
                said = f"prompt {facts.prompt_tokens:,} + max_tokens {output:,} tokens > window {window:,}"
            else:
                said = f"prompt {facts.prompt_tokens:,} tokens > window {window:,}"
            return Rejection("window", said, f"{said} (prompt: {facts.prompt_source})", window)
    return None


@dataclass(slots=True)
class Decision:
    model: str  # the public name
    facts: Facts
    taken: Candidate | None = None
    rejected: list[tuple[Candidate, Rejection]] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)  # routes whose `when` didn't hold
    window: int | None = None  # the taken route's window as eligibility judged it (None: unknown)

    def message(self) -> str:
        why = "; ".join(f"{c.label}: {r.message}" for c, r in self.rejected)
        return f'no route for model "{self.model}" can take this request: {why}'

    def answer(self, surface: Surface | None) -> LocalAnswer:
        """The error when none can: the overflow shape when the window turned the last one down (agents
        compact on it), else a 503 `no_eligible_route` (they retry it)."""
        last = self.rejected[-1][1] if self.rejected else None
        if last is not None and last.kind == "window":
            standard = context_overflow(surface, self.facts.prompt_tokens, last.window)
            text = overflow_message(surface, self.facts.prompt_tokens, last.window) + " " + self.message()
            return _with_message(standard, surface, text)
        return no_eligible_route(surface, self.message())

    def rejected_header(self) -> str | None:
        """`x-tapfix-route-rejected`: `route=kind` per candidate turned down, in order."""
        if not self.rejected:
            return None
        return ", ".join(f"{c.route}={r.kind}" for c, r in self.rejected)

    def record(self) -> dict[str, Any]:
        """The capture's `route_decision`: the route taken, what it matched, the inputs, the rejections."""
        taken = self.taken
        return {
            "model": self.model,
            "route": taken.route if taken else None,
            "upstream": taken.upstream if taken else None,
            "served_model": taken.served_model if taken else None,
            "matched": taken.rule.when.describe() if taken and taken.rule else ("default" if taken else None),
            "inputs": {
                "prompt_tokens": self.facts.prompt_tokens,
                "prompt_source": self.facts.prompt_source,
                "max_tokens": self.facts.max_tokens,
                "needs": list(self.facts.needs),
                "headers": self._headers_seen(),
                "user_agent": self.facts.user_agent,
                "thread": self.facts.thread,
            },
            "rejected": [
                {"route": c.route, "upstream": c.upstream, "kind": r.kind, "reason": r.detail} for c, r in self.rejected
            ],
            "not_matched": self.unmatched,
        }

    def _headers_seen(self) -> dict[str, str]:
        """The headers a rule of this decision asked about, as the request had them."""
        names = {n for c, _ in self.rejected if c.rule for n in c.rule.when.header}
        if self.taken is not None and self.taken.rule is not None:
            names |= set(self.taken.rule.when.header)
        return {n: self.facts.headers[n] for n in sorted(names) if n in self.facts.headers}


def decide(config: Config, model: ModelConfig, served: str, facts: Facts, known: Knowledge) -> Decision:
    decision = Decision(model.name, facts)
    listed = candidates(config, model, served, facts, known.affinity)
    matched = {c.route for c in listed}
    decision.unmatched = [r.name for r in model.routes if r.name not in matched]
    for c in listed:
        why = rejection(config, c, facts, known)
        if why is None:
            decision.taken, decision.window = c, window_of(c, known)
            return decision
        decision.rejected.append((c, why))
    return decision


def _with_message(answer: LocalAnswer, surface: Surface | None, message: str) -> LocalAnswer:
    error = {**answer.error, "message": message}
    body = api_surface(surface).error_body(error)
    return LocalAnswer(answer.status, orjson.dumps(body), error)
