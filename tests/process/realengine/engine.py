"""The real engine for the real-engine suite: llama.cpp's llama-server, built once into a cache outside the
clone by scripts/build-llama-server, serving the tiny model tests/process/realengine/tiny_model.py writes.

The fixtures in conftest.py call these; a test module that needs a server of its own shape (a longer
context, other flags) calls `start_llama_server` through the `llama_server` fixture.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.process.engine_suite import (
    ROOT,
    Provisioned,
    cache_root,
    http_status,
    run_cache_script,
)
from tests.support.procs import Proc, free_port

BUILD_SCRIPT = ROOT / "scripts" / "build-llama-server"
BUILD_TIMEOUT = 1500  # a cold build took 15 minutes on 2 cores shared with the suite
MISSING_TOOLCHAIN = 3  # the script's exit status when cmake or a C++ compiler is missing
HEALTH_TIMEOUT = 60.0

# The real chat templates, as the build directory holds them (copied from the sdist's
# vendor/llama.cpp/models/templates/): Qwen2.5-Instruct's makes llama.cpp pick its Hermes/Qwen
# tool-call format; QwQ's is a reasoning template (llama.cpp returns `reasoning_content`).
QWEN_TEMPLATE = "Qwen-Qwen2.5-7B-Instruct.jinja"
REASONING_TEMPLATE = "Qwen-QwQ-32B.jinja"


@dataclass(frozen=True)
class Build(Provisioned):
    """What scripts/build-llama-server produced, and whether this run built it (or found it cached)."""

    @property
    def server(self) -> Path:
        return self.dir / "bin" / "llama-server"

    def template(self, name: str) -> Path:
        return self.dir / "templates" / name


def build_llama_server(timeout: float = BUILD_TIMEOUT) -> Build:
    """Run the build script (a no-op print of the directory when the cache holds the build)."""
    built = run_cache_script(BUILD_SCRIPT, timeout, cannot_status=MISSING_TOOLCHAIN, must_hold="bin/llama-server")
    return Build(built.dir, built.seconds, built.output)


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tiny_model(build: Build) -> Path:
    """The tiny GGUF with Qwen2.5-Instruct's template built in, made once into the cache under its
    recorded sha256 (rebuilt when the file there isn't that model)."""
    from tests.process.realengine import tiny_model

    path = cache_root() / "tiny-model" / tiny_model.MODEL_SHA256[:16] / "tiny.gguf"
    if path.exists() and file_sha256(path) == tiny_model.MODEL_SHA256:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".tiny-{os.getpid()}.gguf")
    tiny_model.write_model(partial, chat_template=build.template(QWEN_TEMPLATE).read_text())
    partial.replace(path)  # atomic: a concurrent reader sees the old file or the whole new one
    return path


@dataclass
class LlamaServer:
    """A running llama-server on loopback, stopped by PID."""

    proc: Proc
    args: list[str]

    @property
    def url(self) -> str:
        return self.proc.url

    @property
    def port(self) -> int:
        return self.proc.port

    def log(self) -> str:
        return self.proc.log()

    def stop(self) -> int:
        return self.proc.stop()


def start_llama_server(
    build: Build,
    model: Path,
    tmp: Path,
    *args: str,
    ctx: int = 2048,
    parallel: int = 1,
    template: str | None = None,
) -> LlamaServer:
    """Start `llama-server` on a free loopback port with one thread, and wait until /health says 200
    (it answers 503 while the model loads). `template` names a file of the build's templates/ to use
    instead of the model's own (Qwen2.5-Instruct's); `args` go last, so they can override the rest.

    With more than one slot the KV cache is unified (-kvu): without it this version splits `-c` among
    the slots (`-c 2048 -np 2` gives each request 1024 tokens); with it every request sees `ctx`, which
    is the number its exceed_context_size_error quotes as `n_ctx`."""
    port = free_port()
    argv = [str(build.server), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "--jinja"]
    argv += ["-c", str(ctx), "-np", str(parallel), "-t", "1", "--no-webui"]
    if parallel > 1:
        argv.append("-kvu")
    if template is not None:
        argv += ["--chat-template-file", str(build.template(template))]
    argv += list(args)
    log_path = tmp / f"llama-server-{port}.log"
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    server = LlamaServer(Proc(popen, port, log_path), argv)
    deadline = time.monotonic() + HEALTH_TIMEOUT
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(
                f"llama-server exited with {popen.returncode} before it was healthy; its log ends:\n"
                + server.log()[-4000:]
            )
        if http_status(port, "GET", "/health", timeout=2) == 200:
            return server
        time.sleep(0.1)
    server.proc.stop(signal.SIGKILL)
    raise TimeoutError(f"llama-server not healthy after {HEALTH_TIMEOUT:.0f}s; its log ends:\n" + server.log()[-4000:])
