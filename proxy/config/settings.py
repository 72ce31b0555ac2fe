"""Run-time settings of one `tapfix run`, from flags or a config file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def parse_listen(value: str, default_port: int) -> tuple[str, int]:
    """`HOST:PORT`, `:PORT`, `PORT` or `HOST` → (host, port); IPv6 as `[::1]:8080`."""
    value = value.strip()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest.lstrip(":")
    elif value.count(":") == 1:
        host, port = value.split(":")
    elif value.isdigit():
        host, port = "", value
    else:
        host, port = value, ""
    try:
        number = int(port) if port else default_port
    except ValueError:
        raise ValueError(f"--listen {value!r}: the port must be a number") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"--listen {value!r}: port out of range")
    return host or "127.0.0.1", number


def is_loopback(host: str) -> bool:
    return host in ("127.0.0.1", "::1", "localhost") or host.startswith("127.")


@dataclass
class Settings:
    upstream: str | None = None
    config_path: Path | None = None
    listen_host: str = "127.0.0.1"
    listen_port: int = 8080
    db: Path = field(default_factory=lambda: Path("captures/tapfix.db"))
    mode: str = "reverse"  # reverse | regular
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
    tool_repair: str = "error"  # error | fail_fast | passthrough | off
    stream_valid_prefix: bool = False  # forward tool-call fragments while provably fine (see toolcalls/prefix.py)
    store_bodies: bool = True
    verbose: bool = False
    token: str | None = None  # required by a non-loopback listen address (addons/auth.py)
    max_age_s: float | None = None  # retention, enforced by the capture writer (proxy/store/retention.py)
    max_db_bytes: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
