"""The request side in one call: route, fill sampling defaults, normalize reasoning, splice.

The router, sampling and reasoning addons all edit the same body; doing it in one pass means one
parse, one splice and one consistent list of changes. `apply` never raises: whatever it can't
handle is forwarded unchanged and flagged, so a bad request is captured, not lost (invariant 3).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from tapfix.proxy.changes import Change
from tapfix.proxy.config.file import Config, ConfigError, ModelConfig, Upstream
from tapfix.proxy.config.model import ENGINE_DIALECT, ReasoningSettings
from tapfix.proxy.content_encoding import DecodedTooLarge, DecodeError, codings, decode_whole
from tapfix.proxy.errors import LocalAnswer, internal_error, request_error
from tapfix.proxy.jsonbody import RepeatedMembers
from tapfix.proxy.jsonsplice import Edit, Set, SpliceError, apply_to_dict, splice
from tapfix.proxy.request.billing_line import strip_billing_blocks, strips_for
from tapfix.proxy.request.reasoning import apply_reasoning
from tapfix.proxy.request.reasoning_replay import (
    NO_REPLAY_ENGINES,
    ReplayAs,
    ReplaySource,
    replay_reasoning,
    session_key,
)
from tapfix.proxy.request.reasoning_replay_responses import replay_responses
from tapfix.proxy.request.routes import Decision, Knowledge, decide, facts_of
from tapfix.proxy.request.routing import Route, RouteError, resolve
from tapfix.proxy.request.sampling import (
    GenerationConfigError,
    SamplingPolicy,
    apply_sampling,
    load_generation_config,
    sent_sampling,
)
from tapfix.proxy.surfaces import Surface, api_surface, surface_for

_CREDENTIAL_HEADERS = ("authorization", "x-api-key", "api-key")
REQUEST_DECODED_LIMIT = 64 * 1024 * 1024  # a compressed request inflating past this gets 413


@dataclass(slots=True)
class Outcome:
    body: bytes  # what to forward (the original object when unchanged)
    changes: list[Change] = field(default_factory=list)
    error: LocalAnswer | None = None  # answer the client with this instead of forwarding
    upstream: Upstream | None = None  # None: the single upstream (quick mode)
    upstream_headers: dict[str, str] = field(default_factory=dict)  # headers to set upstream
    remove_headers: list[str] = field(default_factory=list)  # client headers not to forward
    model: str | None = None
    served_model: str | None = None
    parsed: Any = None  # the client's JSON (None when the body is not JSON)
    sent: dict[str, Any] | None = None  # the parse of `body` as it goes out (None: not known)
    decoded: bytes | None = None  # the client's body decoded, when it came compressed
    flags: set[str] = field(default_factory=set)
    surface: Surface | None = None  # None: not an inference path
    store_bodies: bool = True  # false: the routed model's config asks for metadata only
    replay_reasoning: bool = False  # the routed model replays reasoning: its answered turns are remembered
    replay_missed: int = 0  # resent turns without reasoning that matched none tapfix answered
    decision: Decision | None = None  # issue 38: the route decision of a model with routes


@dataclass(frozen=True, slots=True)
class _ModelPolicy:
    settings: ModelConfig
    sampling: SamplingPolicy


class RequestPolicy:
    """Built once at start (reads generation_config files: raises ConfigError if one is unusable)."""

    def __init__(self, config: Config, environ: Mapping[str, str] | None = None) -> None:
        self.config = config
        self._environ = os.environ if environ is None else environ
        self._known = Knowledge(environ=self._environ)
        self._policies: dict[str, _ModelPolicy] = {}
        self._bodies = RepeatedMembers()  # an agent's tool list, parsed once, not on every turn
        self.turns: ReplaySource | None = None  # where reasoning replay finds answered turns (set at start)
        models = list(config.models.values()) + ([config.quick_model] if config.quick_model else [])
        for m in models:
            self._policies[m.name] = _ModelPolicy(m, self._sampling(m))

    def _sampling(self, m: ModelConfig) -> SamplingPolicy:
        values: dict[str, float | int] = {}
        label = "generation_config.json"
        if m.generation_config is not None:
            try:
                values, label = load_generation_config(m.generation_config)
            except GenerationConfigError as e:
                where = "--generation-config" if m.name == "*" else f"models.{m.name}.generation_config"
                raise ConfigError(f"{self.config.source or 'command line'}: {where}: {e}") from e
        return SamplingPolicy.build(m.sampling, values, label)

    def apply(
        self, path: str, body: bytes, headers: Mapping[str, str], client_addr: str = "", known: Knowledge | None = None
    ) -> Outcome:
        """`client_addr`: the client's address, which with its user-agent says whose turns it may get back
        (reasoning replay). `known`: what the proxy knows of its upstreams now, for a model's routes
        (request/routes.py)."""
        self._known = known or Knowledge(environ=self._environ)
        try:
            encoding = next((v for k, v in headers.items() if k.lower() == "content-encoding"), "")
            if not codings(encoding):
                return self._apply(path, body, headers, client_addr)
            return self._apply_decoded(path, body, headers, encoding, client_addr)
        except Exception as e:  # never raise on input: forward unchanged, say why
            outcome = Outcome(body=body, flags={"request_policy_error"})
            outcome.changes.append(Change("policy", "warning", "$", None, None, f"internal error {e!r}; unchanged"))
            if not self.config.is_quick and len(self.config.upstreams) == 1:
                outcome.upstream = next(iter(self.config.upstreams.values()))
            elif not self.config.is_quick:
                outcome.error = internal_error(surface_for(path), "tapfix could not process this request")
            return outcome

    def _apply_decoded(
        self, path: str, body: bytes, headers: Mapping[str, str], encoding: str, client_addr: str
    ) -> Outcome:
        """A compressed body: the policy reads it decoded. Unchanged, the client's bytes go out as
        they came; changed, the decoded result goes out without Content-Encoding (the router fixes
        Content-Length). One that can't be decoded is forwarded untouched, as before."""
        try:
            decoded = decode_whole(body, encoding, REQUEST_DECODED_LIMIT)
        except DecodedTooLarge:
            outcome = Outcome(body=body, flags={"request_too_large"})
            outcome.error = request_error(
                surface_for(path),
                413,
                f"request body decodes to more than {REQUEST_DECODED_LIMIT // (1024 * 1024)} MiB "
                f"(Content-Encoding: {encoding}); send it smaller",
                "request_too_large",
            )
            return outcome
        except DecodeError:
            return self._apply(path, body, headers, client_addr)  # flagged encoded_request_body, as it came
        plain = {k: v for k, v in headers.items() if k.lower() != "content-encoding"}
        outcome = self._apply(path, decoded, plain, client_addr)
        outcome.decoded = decoded
        if outcome.error is not None or outcome.body is decoded:
            outcome.body, outcome.sent = body, None  # the compressed bytes go: their parse isn't `sent`
            return outcome
        outcome.remove_headers.append("content-encoding")
        outcome.changes.append(
            Change(
                "framing",
                "drop",
                "headers.content-encoding",
                encoding,
                None,
                "the policy changed the decoded body; it goes upstream decoded",
            )
        )
        return outcome

    def _apply(self, path: str, body: bytes, headers: Mapping[str, str], client_addr: str = "") -> Outcome:
        outcome = Outcome(body=body, surface=surface_for(path))
        lowered = {k.lower(): v for k, v in headers.items()}
        encoding = lowered.get("content-encoding", "identity").strip().lower()
        parsed, ok = _parse(body, self._bodies.loads) if encoding in ("", "identity") else (None, False)
        outcome.parsed = parsed
        if encoding not in ("", "identity"):
            outcome.flags.add("encoded_request_body")
        elif not body.strip():
            outcome.flags.add("empty_request_body")
        elif not ok or not isinstance(parsed, dict):
            outcome.flags.add("malformed_request_body")
        if not isinstance(parsed, dict):
            return self._unroutable(outcome)
        route = resolve(self.config, parsed.get("model"))
        if isinstance(route, RouteError):
            if outcome.surface is None:
                return self._unroutable(outcome)  # other paths are forwarded untouched
            outcome.model = parsed.get("model") if isinstance(parsed.get("model"), str) else None
            outcome.error = route.answer(outcome.surface)
            return outcome
        if route.settings is not None and route.settings.routes and route.model is not None:
            decision = decide(
                self.config,
                route.settings,
                route.served_model or route.model,
                facts_of(outcome.surface, parsed, headers, route.model),
                self._known,
            )
            outcome.decision = decision
            if decision.taken is None:
                outcome.model = route.model
                outcome.error = decision.answer(outcome.surface)
                return outcome
            taken = decision.taken
            route = Route(route.model, taken.served_model, self.config.upstreams[taken.upstream], route.settings)
        outcome.model, outcome.served_model, outcome.upstream = (
            route.model,
            route.served_model,
            route.upstream,
        )
        if route.settings is not None and not route.settings.store_bodies:
            outcome.store_bodies = False
        self._credentials(outcome, route.upstream)
        if outcome.surface is None:
            return outcome
        edits: list[Edit] = []
        rename = route.change()
        if rename is not None:
            edits.append(Set(("model",), route.served_model))
            outcome.changes.append(rename)
        if api_surface(outcome.surface).sampling_defaults and not sent_sampling(parsed):
            outcome.flags.add("no_sampling_params")
        policy = self._policies.get(route.settings.name if route.settings else "")
        if policy is not None:
            engine = self._engine(route.upstream)
            if policy.settings.replay_reasoning and engine not in NO_REPLAY_ENGINES:  # on the client's own parse:
                outcome.replay_reasoning = True  # the recorded turns were digested from what their clients sent
                client = (client_addr, lowered.get("user-agent", ""))
                body, parsed = self._replay(body, parsed, outcome, client, headers, engine, policy.settings)
            if strips_for(engine, policy.settings.keep_billing_line):
                body, parsed = self._strip_billing(body, parsed, outcome)
            s_edits, s_changes = apply_sampling(parsed, policy.sampling, outcome.surface, engine)
            edits += s_edits
            outcome.changes += s_changes
            r = apply_reasoning(parsed, self._reasoning(policy.settings, route.upstream), outcome.surface)
            if r.error is not None:
                outcome.error = r.error
                outcome.changes += r.changes
                return outcome
            edits += r.edits
            outcome.changes += r.changes
        outcome.sent = parsed
        if edits:
            outcome.body = self._splice(body, parsed, edits, outcome)
        elif body is not outcome.body:
            outcome.body = body  # the billing block went, nothing else changed
        return outcome

    def _strip_billing(self, body: bytes, parsed: dict[str, Any], outcome: Outcome) -> tuple[bytes, dict[str, Any]]:
        """The body and its parse without Claude Code's billing block; the sampling and reasoning edits
        splice into that. A cut that doesn't parse to what was meant is re-serialized, as `_splice` does."""
        try:
            stripped = strip_billing_blocks(body, parsed, outcome.surface)
        except SpliceError:
            stripped = None
        if stripped is None:
            return body, parsed
        outcome.changes += stripped.changes
        if _parse(stripped.body, self._bodies.loads) == (stripped.parsed, True):
            return stripped.body, stripped.parsed
        outcome.flags.add("request_reserialized")
        return self._serialize(stripped.parsed), stripped.parsed

    def _replay(
        self,
        body: bytes,
        parsed: dict[str, Any],
        outcome: Outcome,
        client: tuple[str, str],
        headers: Mapping[str, str],
        engine: str | None,
        settings: ModelConfig,
    ) -> tuple[bytes, dict[str, Any]]:
        """The body and its parse with recorded reasoning back in the turns the client resent without it."""
        if self.turns is None:
            return body, parsed
        replay_as: ReplayAs | None = "think" if settings.replay_reasoning_as == "think" else None
        session = session_key(headers, parsed)
        try:
            if api_surface(outcome.surface).item_turns:
                replayed = replay_responses(body, parsed, self.turns, client, session, engine)
            else:
                replayed = replay_reasoning(
                    body, parsed, outcome.surface, self.turns, client, session, engine, replay_as
                )
        except (SpliceError, ValueError, TypeError):  # a body that isn't its parse; a lone surrogate orjson refuses
            replayed = None
        if replayed is None:
            return body, parsed
        self.turns.counted(replayed.replayed, replayed.missed)
        outcome.replay_missed = replayed.missed
        outcome.changes += replayed.changes
        if replayed.body is body:
            return body, parsed
        if _parse(replayed.body, self._bodies.loads) == (replayed.parsed, True):
            return replayed.body, replayed.parsed
        outcome.flags.add("request_reserialized")
        return self._serialize(replayed.parsed), replayed.parsed

    @staticmethod
    def _reasoning(settings: ModelConfig, upstream: Upstream | None) -> ReasoningSettings:
        """The model's reasoning settings for the upstream a route took (issue 38): a dialect that came from
        the default upstream's engine follows the route's engine."""
        if upstream is None or upstream.name == settings.upstream or not settings.dialect_from_engine:
            return settings.reasoning
        return replace(settings.reasoning, dialect=ENGINE_DIALECT.get(upstream.engine or ""))

    def _engine(self, upstream: Upstream | None) -> str | None:
        if upstream is None:
            upstream = next(iter(self.config.upstreams.values()), None)
        return upstream.engine if upstream else None

    def _unroutable(self, outcome: Outcome) -> Outcome:
        """No model to route by: one upstream takes it; with several, only surface requests fail."""
        if self.config.is_quick:
            self._credentials(outcome, None)
            return outcome
        upstreams = list(self.config.upstreams.values())
        if len(upstreams) == 1:
            outcome.upstream = upstreams[0]
            self._credentials(outcome, upstreams[0])
        elif outcome.surface is not None:
            message = "request body is not a JSON object with a 'model'; tapfix routes by model"
            outcome.error = request_error(outcome.surface, 400, message, "invalid_body")
        return outcome

    def _credentials(self, outcome: Outcome, upstream: Upstream | None) -> None:
        if upstream is None:
            upstream = next(iter(self.config.upstreams.values()), None) if self.config.is_quick else None
        if upstream is None or not upstream.api_key_env:
            return
        headers = upstream.auth_headers(self._environ)
        if not headers:
            outcome.flags.add("upstream_credential_missing")
            return
        outcome.upstream_headers.update(headers)
        outcome.remove_headers = [h for h in _CREDENTIAL_HEADERS if h not in outcome.upstream_headers]

    def _splice(self, body: bytes, parsed: dict[str, Any], edits: list[Edit], outcome: Outcome) -> bytes:
        """Splice into the client's bytes; what can't be spliced is re-serialized. A splice parses to exactly the
        edited object (tests/unit/test_jsonsplice_parsed.py shows it for any object, edits and spacing), so it
        is not parsed again to check."""
        expected = outcome.sent = edited(parsed, edits)
        try:
            return splice(body, edits, parsed)
        except (SpliceError, ValueError):  # ValueError: orjson refusing a lone-surrogate key while splicing
            outcome.flags.add("request_reserialized")
            return self._serialize(expected)

    @staticmethod
    def _serialize(expected: dict[str, Any]) -> bytes:
        try:
            return json.dumps(expected, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (legal JSON as a \u escape): keep it escaped
            return json.dumps(expected).encode("ascii")


def edited(parsed: dict[str, Any], edits: list[Edit]) -> dict[str, Any]:
    """`apply_to_dict(parsed, edits)` copying only the members the edits touch: the object a splice parses to."""
    touched = {e.path[0] for e in edits}
    changed = apply_to_dict({k: parsed[k] for k in touched if k in parsed}, edits)
    # In the order of the spliced bytes: members edited in place stay where they were, added ones come last.
    out = {k: changed[k] if k in touched else v for k, v in parsed.items() if k not in touched or k in changed}
    out.update((k, v) for k, v in changed.items() if k not in parsed)
    return out


def _parse(body: bytes, loads: Callable[[bytes], Any] = orjson.loads) -> tuple[Any, bool]:
    """`loads`: orjson's, or one that gives the same value and raises the same error (RepeatedMembers)."""
    try:
        return loads(body), True
    except orjson.JSONDecodeError:
        pass
    try:  # integers beyond 64 bits, lone surrogates: what orjson refuses and servers may accept
        return json.loads(body, parse_constant=_reject), True
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, False


def _reject(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
