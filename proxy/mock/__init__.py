"""`tapfix mock`: a scripted OpenAI-compatible upstream that speaks vLLM's exact wire format.

No GPU model runs in tests, the demo or the benchmarks, so this server plays one: a tiny
deterministic agent-friendly model by default, corpus cases (`--case`), and scripted failures
(`--scenario`). See docs/mock.md.
"""

from tapfix.proxy.mock.app import create_app
from tapfix.proxy.mock.options import DEFAULT_MODEL, MockOptions, RecordedResponse
from tapfix.proxy.mock.scenario import ScenarioError, shipped_scenarios
from tapfix.proxy.mock.serve import serve, uvicorn_config

__all__ = [
    "DEFAULT_MODEL",
    "MockOptions",
    "RecordedResponse",
    "ScenarioError",
    "create_app",
    "serve",
    "shipped_scenarios",
    "uvicorn_config",
]
