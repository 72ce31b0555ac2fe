"""Run-time settings of one `tapfix run`, from flags or a config file.

Listen addresses are read and judged in `tapfix.proxy.net` (`parse_listen`, `is_loopback`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from tapfix.proxy.store.locator import StoreLocator
    from tapfix.proxy.telemetry.config import ExportConfig

ProxyMode = Literal["reverse", "regular"]
# What tapfix does with a tool call it can't recover: a retryable error (agents regenerate the turn), a
# permanent-looking one, the broken call as it came, or no tool-call stage at all.
ToolRepairPolicy = Literal["error", "fail_fast", "passthrough", "off"]


@dataclass
class Settings:
    upstream: str | None = None
    config_path: Path | None = None
    listen_host: str = "127.0.0.1"
    listen_port: int = 8080
    db: StoreLocator = field(default_factory=lambda: _default_store())
    mode: ProxyMode = "reverse"
    intercept: list[str] = field(default_factory=list)
    upstream_ca: Path | None = None
    insecure: bool = False
    connect_timeout: float = 5.0
    idle_timeout: int = 600
    strict: bool = False
    engine: str | None = None
    generation_config: Path | None = None
    reasoning_dialect: str | None = None
    upstream_key_env: str | None = None
    tool_repair: ToolRepairPolicy = "error"
    stream_valid_prefix: bool = False  # forward tool-call fragments while provably fine (see toolcalls/prefix.py)
    tool_format: str | None = None  # quick mode's pinned tool-call format (`--tool-format`; docs/formats.md)
    store_bodies: bool = True
    verbose: bool = False
    token: str | None = None  # required by a non-loopback listen address (addons/auth.py)
    max_age_s: float | None = None  # retention, enforced by the capture writer (proxy/store/retention.py)
    max_db_bytes: int | None = None
    # The capture writer's hold while the database is out of reach (proxy/store/held.py); None: its default.
    store_queue: int | None = None
    store_queue_bytes: int | None = None
    # Issue 19: extra upstream attempts for a tool call that can't be saved (0: off) and their time
    # budget; proxy/regenerate/eligibility.py.
    regenerate: int = 1
    regenerate_budget: float = 60.0
    regenerate_unknown_tool: bool = False  # also regenerate a call to a tool that wasn't offered
    shutdown_grace: float = 5.0  # seconds in-flight exchanges get after SIGTERM (addons/shutdown.py); 0: none
    # Issue 20: OTLP export (None: off), from --otlp / --browse-url and the OTEL_* variables.
    export: ExportConfig | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _default_store() -> StoreLocator:
    from tapfix.proxy.store.locator import StoreLocator

    return StoreLocator.resolve()
