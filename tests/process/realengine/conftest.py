"""Fixtures for the real-engine suite (marker `realengine`): llama.cpp's llama-server, built once into
the cache by scripts/build-llama-server, serving the tiny model, with `tapfix run` in front of it.

Locally a machine without cmake or a C++ compiler (or a failed build) skips the suite with the reason;
under CI=true that is a failure, which prints the tail of the build log.

- `llama_build` (session): the build (`.dir` holds bin/llama-server and templates/).
- `tiny_model_path` (session): the tiny GGUF in the cache.
- `llama_server(*args, ctx=, parallel=, template=)` (module): start another server, stopped at the
  module's end.
- `llama` (module): the tiny model with its own template, Qwen2.5-Instruct's (Hermes tool calls).
- `llama_reasoning` (module): the same model with QwQ's template (reasoning), via --chat-template-file.
- `tapfix_in_front(server, *args)` (module): a `tapfix run` proxy in front of a server, with its own
  capture database (`proc.extra["db"]`); `llama_proxy` is one in front of `llama`. It runs in the test
  process (tests/support/inproc.py: the engine is the process here); a module's proxies take turns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.process.engine_suite import provided, stopped_at_the_end
from tests.process.realengine.engine import (
    REASONING_TEMPLATE,
    Build,
    LlamaServer,
    build_llama_server,
    start_llama_server,
    tiny_model,
)
from tests.support.inproc import InprocProxy, start_proxy

# n=2 (two choices for one request): this version's llama-server runs each choice as a task of its own
# on a slot of its own, and refuses n above the slot count: with -np 1 an n=2 request gets a 400
# ("Field 'n': Value must be between 1 <= value <= 1, but got 2"). So `llama` has two slots; with
# them the KV cache is unified (start_llama_server adds -kvu), so every request still sees LLAMA_CTX.
LLAMA_PARALLEL = 2
LLAMA_CTX = 2048


@pytest.fixture(scope="session")
def llama_build() -> Build:
    return provided(
        build_llama_server, "real-engine suite", "built", lambda b: f"[realengine] built llama-server into {b.dir}"
    )


@pytest.fixture(scope="session")
def tiny_model_path(llama_build: Build) -> Path:
    return tiny_model(llama_build)


@pytest.fixture(scope="module")
def llama_server(
    llama_build: Build, tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., LlamaServer]]:
    tmp = tmp_path_factory.mktemp("llama")

    def start(*args: str, ctx: int = LLAMA_CTX, parallel: int = 1, template: str | None = None) -> LlamaServer:
        return start_llama_server(
            llama_build, tiny_model_path, tmp, *args, ctx=ctx, parallel=parallel, template=template
        )

    yield from stopped_at_the_end(start)


@pytest.fixture(scope="module")
def llama(llama_server: Callable[..., LlamaServer]) -> LlamaServer:
    return llama_server(parallel=LLAMA_PARALLEL)


@pytest.fixture(scope="module")
def llama_reasoning(llama_server: Callable[..., LlamaServer]) -> LlamaServer:
    return llama_server(parallel=LLAMA_PARALLEL, template=REASONING_TEMPLATE)


@pytest.fixture(scope="module")
def tapfix_in_front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., InprocProxy]]:
    def start(server: LlamaServer, *args: str) -> InprocProxy:
        tmp = tmp_path_factory.mktemp("tapfix")
        return start_proxy(tmp, server.url, *args, shared=True)  # in-process: one at a time, each comes back

    yield from stopped_at_the_end(start)


@pytest.fixture(scope="module")
def llama_proxy(tapfix_in_front: Callable[..., InprocProxy], llama: LlamaServer) -> InprocProxy:
    return tapfix_in_front(llama)
