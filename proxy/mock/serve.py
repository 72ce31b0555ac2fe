"""Run the mock under uvicorn: quiet (warnings only, no access log), loopback by default."""

from __future__ import annotations

import uvicorn
from tapfix.proxy.mock.app import create_app
from tapfix.proxy.mock.options import MockOptions


def uvicorn_config(opts: MockOptions, host: str = "127.0.0.1", port: int = 8000) -> uvicorn.Config:
    """The config `serve` uses; tests start a `uvicorn.Server` from it on a free port."""
    return uvicorn.Config(
        create_app(opts),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        # The app writes `date` and `server` itself, so replayed captures keep their own.
        server_header=False,
        date_header=False,
        lifespan="off",
        timeout_graceful_shutdown=1,
    )


def serve(opts: MockOptions, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve until interrupted (blocking). Raises ValueError on a bad scenario or case file."""
    uvicorn.Server(uvicorn_config(opts, host, port)).run()
