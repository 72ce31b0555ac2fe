"""mitmproxy addons: thin adapters from hooks to the pure logic in `tapfix.proxy`."""

from __future__ import annotations

from .health import Health
from .recorder import RecordExchange, RecordRequest
from .router import Router
from .runtime import Runtime
from .stream import StreamOwner


def default_addons(runtime: Runtime) -> list[object]:
    """The chain, in the order of ../shared/DESIGN.md: recorder, router(+policy), stream, recorder."""
    return [Health(runtime), RecordRequest(runtime), Router(runtime), StreamOwner(runtime), RecordExchange(runtime)]
