"""Fixtures for the vLLM suite (marker `vllm`): vLLM's CPU build, installed once into the cache by
scripts/install-vllm, serving the tiny Qwen3 model, with `tapfix run` in front of it.

Locally a machine without Python 3.11 (or a failed install) skips the suite with the reason; under CI=true
that is a failure, which prints the tail of the install log.

Two vLLM starts per run, side by side (a start is a minute or two of CPU on two busy cores; both fit in
memory with the small KV cache, about 1.3 GB each):
- `vllm` (package): automatic tool choice with the per-request parser switch (`hermes` unless
  `chat_template_kwargs.tool_parser` names another of vLLM's parsers), the `qwen3` reasoning parser, the
  project's logits processor and the request log. Every test but one uses it.
- `vllm_no_auto` (package): no `--enable-auto-tool-choice`, no parsers: vLLM's refusal of `tool_choice: "auto"`.
Both start when the first test needs either, and stop (by process group) after the suite's last test, not at the
end of the session: idle, the two servers still took 3% of a core and 2.6 GB for the rest of the run. The xdist
scheduler keeps every file of tests/process/vllm/ on one worker (tests/conftest.py), and a plain run sorts them
together (early_build.order), so each starts once per run.

- `vllm_install` (session), `tiny_qwen3_dir` (session): the install and the model directory in the cache.
- `tapfix_in_front(server, *args)` (module): `tapfix run` in front of a server or relay (the realengine suite's).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.process.engine_suite import provided
from tests.process.realengine.conftest import tapfix_in_front
from tests.process.vllm.engine import Install, VllmServer, install_vllm, launch, model_dir, switch_parser_args

__all__ = ["tapfix_in_front"]


@pytest.fixture(scope="session")
def vllm_install() -> Install:
    return provided(
        install_vllm, "vLLM suite", "installed", lambda i: f"[vllm] installed vLLM into {i.dir} (route {i.route})"
    )


@pytest.fixture(scope="session")
def tiny_qwen3_dir(vllm_install: Install) -> Path:
    return model_dir(vllm_install)


@pytest.fixture(scope="package")
def vllm_servers(
    vllm_install: Install, tiny_qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, VllmServer]]:
    tmp = tmp_path_factory.mktemp("vllm")
    servers: dict[str, VllmServer] = {}
    try:
        servers["main"] = launch(
            vllm_install, tiny_qwen3_dir, tmp, "main", *switch_parser_args(), "--reasoning-parser", "qwen3"
        )
        servers["no_auto"] = launch(vllm_install, tiny_qwen3_dir, tmp, "no_auto")
        for server in servers.values():
            server.wait_ready()
        started = ", ".join(f"{name} in {s.ready_seconds:.0f}s" for name, s in servers.items())
        print(f"\n[vllm] {vllm_install.route} route; servers ready: {started}")
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture(scope="package")
def vllm(vllm_servers: dict[str, VllmServer]) -> VllmServer:
    return vllm_servers["main"]


@pytest.fixture(scope="package")
def vllm_no_auto(vllm_servers: dict[str, VllmServer]) -> VllmServer:
    return vllm_servers["no_auto"]
