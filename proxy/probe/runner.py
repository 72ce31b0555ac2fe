"""Run the checks in order against one server (quick mode) or every configured model (config mode).

Checks run one after another, never in parallel: a probe must not load a GPU server more than one
user does, and TTFT is only meaningful for a request that does not queue behind another. Any
exception inside a check becomes that check's failure, so one broken ability never hides the rest.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
from tapfix.proxy.probe.checks import CHECK_FUNCTIONS, Ctx, Verdict, listed_entry, listed_ids, models_quick
from tapfix.proxy.probe.client import Answer, Capture, PolicyHook, Prepared, ProbeClient, shorten
from tapfix.proxy.probe.report import CheckResult, ProbeReport, Status

if TYPE_CHECKING:
    from tapfix.proxy.config.file import Config, Upstream

ALL_CHECKS: tuple[str, ...] = (
    "models",
    "completion",
    "streaming",
    "tools",
    "reasoning",
    "vision",
    "long_context",
    "sampling",
)
CHEAP_CHECKS: list[str] = ["models", "completion", "streaming"]


@dataclass(frozen=True, slots=True)
class ProbeOptions:
    needle_tokens: int = 2000
    needle_depth: float = 0.5
    max_tokens: int = 512


def select_checks(checks: Iterable[str] | None) -> list[str]:
    """The checks to run, in the canonical order; raises ValueError naming an unknown one."""
    if checks is None:
        return list(ALL_CHECKS)
    wanted = [c.strip() for c in checks if c.strip()]
    unknown = [c for c in wanted if c not in ALL_CHECKS]
    if unknown:
        raise ValueError(f"unknown check {', '.join(unknown)}; expected some of {', '.join(ALL_CHECKS)}")
    return [c for c in ALL_CHECKS if c in wanted]


async def run_probe(
    base_url: str,
    model: str | None,
    *,
    checks: list[str] | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
    capture: Capture | None = None,
    policy: Any = None,
    options: ProbeOptions | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> ProbeReport:
    """Probe one OpenAI-compatible server. Without `model`, the first model it lists.

    `capture` (e.g. `CaptureWriter.submit`) receives every probe exchange, tagged `probe`.
    `policy` (a `RequestPolicy`) makes the probe send bodies as the proxy would forward them.
    Raises ValueError for a bad URL or check name; an unreachable server is `report.unreachable`.
    """
    selected = select_checks(checks)
    opts = options or ProbeOptions()
    report = ProbeReport(target=base_url, model=model)
    hook = policy_hook(policy) if policy is not None else None
    async with ProbeClient(
        base_url, headers=headers, timeout=timeout, capture=capture, policy=hook, transport=transport
    ) as client:
        started = time.perf_counter()
        try:
            listing = await client.get("/v1/models", "models")
        except httpx.ConnectError as e:
            report.unreachable = f"cannot connect to {client.url('/v1/models')}: {_reason(e)}"
            return report
        except httpx.HTTPError as e:
            listing = None
            failure = f"/v1/models did not answer: {_reason(e)}"
        ms = (time.perf_counter() - started) * 1000
        if listing is None:
            report.results.append(CheckResult("models", "fail", ms, failure))
            _skip_rest(report, selected, "the server did not answer /v1/models")
            return report
        ids = listed_ids(listing)
        explicit = model is not None
        model = model or (ids[0] if ids else None)
        report.model = model
        if "models" in selected:
            v = models_quick(listing, model, explicit)
            report.results.append(
                CheckResult("models", v.status, ms, v.detail, captures=[listing.capture_id], data=v.data)
            )
        if model is None:
            _skip_rest(report, selected, "no model to probe: /v1/models lists none; pass --model")
            return report
        ctx = Ctx(
            client,
            model,
            listed_entry(listing, model),
            opts.needle_tokens,
            opts.needle_depth,
            opts.max_tokens,
            sampling=_sampling_preview(policy, model) if policy is not None else None,
        )
        for name in selected:
            if name != "models":
                report.results.append(await run_check(name, ctx, timeout))
    return report


async def run_config_probe(
    config: Config,
    model: str | None = None,
    *,
    checks: list[str] | None = None,
    timeout: float = 60,
    capture: Capture | None = None,
    options: ProbeOptions | None = None,
    environ: Mapping[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> ProbeReport:
    """Probe every configured model (or one, by public name or alias), each on its own upstream.

    Requests go through the config's request policy (model rename, sampling, reasoning dialect,
    credentials), so the probe sends what the proxy would forward. Raises ValueError for a model
    that is not in the config, ConfigError for an unusable generation_config.
    """
    from tapfix.proxy.request.policy import RequestPolicy
    from tapfix.proxy.request.routing import RouteError, resolve

    selected = select_checks(checks)
    opts = options or ProbeOptions()
    env = os.environ if environ is None else environ
    policy = RequestPolicy(config, env)
    if model is not None:
        route = resolve(config, model)
        if isinstance(route, RouteError) or route.settings is None:
            names = ", ".join([*config.models, *config.aliases()])
            raise ValueError(f"model {model!r} is not in {config.source or 'the config'}; configured: {names}")
        targets = [route.settings]
    else:
        targets = list(config.models.values())
    report = ProbeReport(target=config.source or "config", model=model)
    upstream_names = list(dict.fromkeys(m.upstream for m in targets))
    report.results += config_problems(config, upstream_names, env)
    clients = {
        name: ProbeClient(
            config.upstreams[name].base_url,
            headers=_credential(config.upstreams[name], env),
            timeout=timeout,
            capture=capture,
            policy=policy_hook(policy),
            transport=transport,
        )
        for name in upstream_names
    }
    try:
        listings: dict[str, Answer | str] = {}
        started = time.perf_counter()
        for name, client in clients.items():
            try:
                listings[name] = await client.get("/v1/models", "models")
            except httpx.HTTPError as e:
                listings[name] = f"upstream {name}: cannot reach {client.url('/v1/models')}: {_reason(e)}"
        ms = (time.perf_counter() - started) * 1000
        if all(isinstance(v, str) for v in listings.values()):
            report.unreachable = "; ".join(str(v) for v in listings.values())
            return report
        if "models" in selected:
            problems: list[str] = []
            served: list[str] = []
            for name, listing in listings.items():
                if isinstance(listing, str):
                    problems.append(listing)
                elif not listing.ok:
                    problems.append(f"upstream {name}: /v1/models failed: {listing.error_text()}")
                else:
                    problems += _unserved(config, name, listed_ids(listing))
                    served += [_served_label(m) for m in config.models.values() if m.upstream == name]
            ids = [a.capture_id for a in listings.values() if isinstance(a, Answer)]
            status: Status = "fail" if problems else "pass"
            detail = "; ".join(problems) if problems else "served: " + "; ".join(served)
            report.results.append(CheckResult("models", status, ms, detail, model="*", captures=ids))
        for m in targets:
            listing = listings[m.upstream]
            if isinstance(listing, str):
                for name in selected:
                    if name != "models":
                        report.results.append(CheckResult(name, "fail", 0, listing, model=m.name))
                continue
            ctx = Ctx(
                clients[m.upstream],
                m.name,
                listed_entry(listing, m.upstream_model),
                opts.needle_tokens,
                opts.needle_depth,
                opts.max_tokens,
                sampling=_sampling_preview(policy, m.name),
            )
            for name in selected:
                if name != "models":
                    result = await run_check(name, ctx, timeout)
                    result.model = m.name
                    report.results.append(result)
    finally:
        for client in clients.values():
            await client.close()
    return report


def config_problems(config: Config, upstreams: list[str], env: Mapping[str, str]) -> list[CheckResult]:
    """What `tapfix check` finds wrong with the probed upstreams' settings (an unset key variable,
    an unreadable CA file), as failed `config` rows worded as `check` words them: a server that takes
    any key would otherwise pass every check while `tapfix run` sends no credential."""
    from tapfix.proxy.request.routing import preflight_static

    wanted = {f"upstreams.{name}" for name in upstreams}
    return [
        CheckResult("config", "fail", 0, str(p), model="*")
        for p in preflight_static(config, env)
        if p.severity == "error" and p.where.rpartition(".")[0] in wanted
    ]


async def run_check(name: str, ctx: Ctx, timeout: float) -> CheckResult:
    """Run one check, timed; its requests' capture ids are attached to the result."""
    seen = len(ctx.client.sent)
    started = time.perf_counter()
    try:
        verdict = await CHECK_FUNCTIONS[name](ctx)
    except httpx.TimeoutException:
        verdict = Verdict("fail", f"no answer within {timeout:g} s (raise --timeout for a slow server)")
    except httpx.HTTPError as e:
        verdict = Verdict("fail", f"request failed: {_reason(e)}")
    except Exception as e:  # noqa: BLE001 - a probe bug must show as one failed row, not a crash
        verdict = Verdict("fail", f"probe error: {type(e).__name__}: {e}")
    ms = (time.perf_counter() - started) * 1000
    return CheckResult(name, verdict.status, ms, verdict.detail, captures=ctx.client.sent[seen:], data=verdict.data)


def policy_hook(policy: Any) -> PolicyHook:
    """Adapt `RequestPolicy.apply` to the client: the body as forwarded, its changes, its headers."""

    def prepare(path: str, body: bytes) -> Prepared:
        outcome = policy.apply(path, body, {})
        return Prepared(outcome.body, list(outcome.changes), dict(outcome.upstream_headers), outcome.error)

    return prepare


def _sampling_preview(policy: Any, model: str) -> Any:
    """What tapfix fills into a request that sends no sampling parameters (the agents' usual case)."""

    def preview() -> Verdict:
        body = b'{"model": %b, "messages": [{"role": "user", "content": "hi"}]}' % _json_str(model)
        outcome = policy.apply("/v1/chat/completions", body, {})
        filled = [c for c in outcome.changes if c.stage == "sampling"]
        if not filled:
            how = "--generation-config" if policy.config.is_quick else "generation_config or [models.X.sampling]"
            return Verdict(
                "pass",
                "no sampling defaults configured: requests without sampling parameters get "
                f"the server's own defaults (set {how})",
            )
        by_reason: dict[str, list[str]] = {}
        for c in filled:
            by_reason.setdefault(c.reason, []).append(f"{c.path.removeprefix('$.')}={c.after}")
        parts = [f"{', '.join(v)} ({reason})" for reason, v in by_reason.items()]
        return Verdict("pass", "tapfix fills " + "; ".join(parts), {"filled": {c.path: c.after for c in filled}})

    return preview


def _json_str(value: str) -> bytes:
    import orjson

    return orjson.dumps(value)


def _credential(upstream: Upstream, env: Mapping[str, str]) -> dict[str, str]:
    return upstream.auth_headers(env)


def _served_label(m: Any) -> str:
    aliases = f" (aliases {', '.join(m.aliases)})" if m.aliases else ""
    return f"{m.name} → {m.upstream_model} on {m.upstream}{aliases}"


def _unserved(config: Any, upstream: str, ids: list[str]) -> list[str]:
    """The naming trap in config mode: every configured served id must be in the upstream's list."""
    import difflib

    out = []
    for m in config.models.values():
        if m.upstream != upstream or m.upstream_model in ids:
            continue
        close = difflib.get_close_matches(m.upstream_model, ids, n=1, cutoff=0.4)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        out.append(
            f"model {m.name!r} ({m.upstream_model!r}) is not served by upstream {upstream}; "
            f"/v1/models lists: {', '.join(ids) or 'nothing'}{hint}"
        )
    return out


def _skip_rest(report: ProbeReport, selected: list[str], why: str) -> None:
    for name in selected:
        if name != "models":
            report.results.append(CheckResult(name, "skip", 0, why))


def _reason(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return shorten(f"{type(e).__name__}: {text}" if str(e) else text, 160)
