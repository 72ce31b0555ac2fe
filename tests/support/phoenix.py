"""Arize Phoenix as a real OTLP trace receiver: installed by scripts/install-phoenix (its own venv,
`.ci/run` calls the same script), started offline on loopback, queried through its REST API, stopped
by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.support.ci import unavailable
from tests.support.procs import free_port

ROOT = Path(__file__).resolve().parent.parent.parent
INSTALL_TIMEOUT_S = 900
START_TIMEOUT_S = 120


def phoenix_executable() -> str:
    """The `phoenix` executable, installing it the first time; unavailable (skip, or fail in CI) if that fails."""
    try:
        out = subprocess.run(
            [str(ROOT / "scripts" / "install-phoenix")], capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        unavailable(f"Arize Phoenix could not be installed: {e}")
    if out.returncode != 0 or not out.stdout.strip():
        unavailable(f"Arize Phoenix could not be installed (scripts/install-phoenix): {out.stderr[-2000:]}")
    return out.stdout.strip().splitlines()[-1]


@dataclass
class Phoenix:
    proc: subprocess.Popen[bytes]
    port: int  # the UI, the REST API and OTLP/HTTP (/v1/traces)
    grpc_port: int  # OTLP/gRPC
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spans(self, project: str, limit: int = 100) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/v1/projects/{project}/spans", params={"limit": limit}, timeout=10)
        if r.status_code == 404:  # the project appears with its first span
            return []
        r.raise_for_status()
        data: list[dict[str, Any]] = r.json()["data"]
        return data

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: phoenix and nothing else
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def start_phoenix(executable: str, tmp: Path) -> Phoenix:
    port, grpc_port = free_port(), free_port()
    work = tmp / "phoenix"
    work.mkdir()
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PHOENIX_"))
    } | {  # offline, on loopback, nothing kept outside tmp
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_WORKING_DIR": str(work),
        "PHOENIX_TELEMETRY_ENABLED": "false",
        "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
        "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
        "PHOENIX_ENABLE_MCP_SERVER": "false",
        "HF_HUB_OFFLINE": "1",
        "DO_NOT_TRACK": "1",
    }
    log_path = tmp / "phoenix.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [executable, "serve"], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    phoenix = Phoenix(proc, port, grpc_port, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"phoenix exited {proc.returncode}: {log_path.read_text(errors='replace')[-3000:]}")
        try:
            if httpx.get(f"{phoenix.url}/healthz", timeout=2).status_code == 200:
                return phoenix
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    phoenix.stop()
    raise RuntimeError(f"phoenix not ready after {START_TIMEOUT_S}s: {log_path.read_text(errors='replace')[-3000:]}")
