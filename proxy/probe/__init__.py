"""Deep health probes: does the model behind a server really work, not just its port.

`run_probe` (one server, quick mode) and `run_config_probe` (every configured model) send a few
small, deterministic requests and judge the answers; `tapfix probe` prints the report. Pure
asyncio + httpx: no mitmproxy, so the proxy can call it in the background for `/tapfix/health`.
"""

from __future__ import annotations

from tapfix.proxy.probe.report import CheckResult, ProbeReport
from tapfix.proxy.probe.runner import ALL_CHECKS, CHEAP_CHECKS, ProbeOptions, run_config_probe, run_probe

__all__ = [
    "ALL_CHECKS",
    "CHEAP_CHECKS",
    "CheckResult",
    "ProbeOptions",
    "ProbeReport",
    "run_config_probe",
    "run_probe",
]
