"""mitmproxy addons: thin adapters from hooks to the pure logic in `tapfix.proxy`."""

from __future__ import annotations

from tapfix.addons.auth import TokenAuth
from tapfix.addons.health import Health
from tapfix.addons.malformed import RecordMalformed
from tapfix.addons.metrics import Metrics
from tapfix.addons.recorder import RecordExchange, RecordRequest
from tapfix.addons.release import Release
from tapfix.addons.replay import RememberTurns
from tapfix.addons.router import Router
from tapfix.addons.runner.runtime import Runtime
from tapfix.addons.shutdown import Shutdown
from tapfix.addons.stale_connection import ResendOnStaleConnection
from tapfix.addons.stream import StreamOwner
from tapfix.addons.trace_context import TraceContext
from tapfix.addons.window import Window

KEEPALIVE_S = 5.0  # a `: keep-alive` comment this often while the client waits for a later attempt


def default_addons(runtime: Runtime) -> list[object]:
    """The chain, in the order of ../shared/DESIGN.md: recorder, router(+policy), trace context, stream, recorder;
    with a token (a non-loopback listen address), the token check comes first. Shutdown follows the
    recorder, so the 503 it answers while draining is recorded like any answer."""
    chain: list[object] = [
        Health(runtime),
        Metrics(runtime),
        RecordRequest(runtime),
        Shutdown(runtime),
        Router(runtime),
        TraceContext(runtime),  # after the router: it reads and writes the request as forwarded
        ResendOnStaleConnection(runtime),  # before the stream owner: its answer goes out in place of the error
        StreamOwner(runtime),
        Window(runtime),  # after the stream owner: it reads the upstream's error body the owner recorded
        RecordExchange(runtime),
        RecordMalformed(runtime),
        Release(runtime),  # last: a finished flow lets go of tapfix's objects
    ]
    if runtime.replay_turns is not None:  # issue 36: a model replays reasoning; after the recorder: the turn is whole
        chain.insert(chain.index(next(a for a in chain if isinstance(a, RecordExchange))) + 1, RememberTurns(runtime))
    config = getattr(runtime.policy, "config", None)
    if config is not None and any(m.routes for m in config.models.values()):  # issue 38: routes fall back
        from tapfix.addons.route_fallback import RouteFallback

        router = next(a for a in chain if isinstance(a, Router))
        resend = next(a for a in chain if isinstance(a, ResendOnStaleConnection))
        chain.insert(chain.index(resend), RouteFallback(runtime, router))  # a route's missing head is its case
    if runtime.settings.regenerate > 0:  # issue 19: only then may a request get a later attempt
        from tapfix.addons.attempts import LaterAttempts

        verify: bool | str = not runtime.settings.insecure
        if runtime.settings.upstream_ca is not None and verify:
            verify = str(runtime.settings.upstream_ca)
        runtime.attempts = LaterAttempts(KEEPALIVE_S, verify, runtime.settings.connect_timeout)
        chain.insert(chain.index(next(a for a in chain if isinstance(a, Router))), runtime.attempts)
        # A non-streamed answer's new attempt: after the stream owner's body repair, before the recorder.
        from tapfix.addons.regenerate_body import RegenerateBody

        chain.insert(chain.index(next(a for a in chain if isinstance(a, StreamOwner))) + 1, RegenerateBody(runtime))
    if runtime.settings.token:  # beyond loopback: the token check comes first, before health too
        chain.insert(0, TokenAuth(runtime, runtime.settings.token))
    return chain
