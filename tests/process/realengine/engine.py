"""The real engine for the real-engine suite: llama.cpp's llama-server, built once into a cache outside the
clone by scripts/build-llama-server, serving the tiny model tests/process/realengine/tiny_model.py writes.

The fixtures in conftest.py call these; a test module that needs a server of its own shape (a longer
context, other flags) calls `start_llama_server` through the `llama_server` fixture.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.procs import Proc, free_port

ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = ROOT / "scripts" / "build-llama-server"
BUILD_TIMEOUT = 1500  # a cold build took 15 minutes on 2 cores shared with the suite
MISSING_TOOLCHAIN = 3  # the script's exit status when cmake or a C++ compiler is missing
HEALTH_TIMEOUT = 60.0

# The real chat templates, as the build directory holds them (copied from the sdist's
# vendor/llama.cpp/models/templates/): Qwen2.5-Instruct's makes llama.cpp pick its Hermes/Qwen
# tool-call format; QwQ's is a reasoning template (llama.cpp returns `reasoning_content`).
QWEN_TEMPLATE = "Qwen-Qwen2.5-7B-Instruct.jinja"
REASONING_TEMPLATE = "Qwen-QwQ-32B.jinja"


def cache_root() -> Path:
    """Where built things outlive the clone: the server build and the tiny model."""
    return Path(os.environ.get("TAPFIX_CACHE") or Path.home() / ".cache" / "tapfix")


class EngineUnavailable(Exception):
    """This machine can't provide the engine; the message says why (the fixture turns it into a skip
    locally, a failure under CI)."""


@dataclass(frozen=True)
class Build:
    """What scripts/build-llama-server produced, and whether this run built it (or found it cached)."""

    dir: Path
    seconds: float
    output: str  # the script's stderr: its progress lines

    @property
    def server(self) -> Path:
        return self.dir / "bin" / "llama-server"

    def template(self, name: str) -> Path:
        return self.dir / "templates" / name


def build_llama_server(timeout: float = BUILD_TIMEOUT) -> Build:
    """Run the build script (a no-op print of the directory when the cache holds the build)."""
    started = time.monotonic()
    try:
        result = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise EngineUnavailable(f"scripts/build-llama-server did not finish within {timeout:.0f}s") from exc
    seconds = time.monotonic() - started
    if result.returncode == MISSING_TOOLCHAIN:
        raise EngineUnavailable(f"llama-server can't be built here: {result.stderr.strip()}")
    if result.returncode != 0:
        raise EngineUnavailable(
            f"scripts/build-llama-server failed (exit {result.returncode}); its output ends:\n{result.stderr[-6000:]}"
        )
    lines = result.stdout.strip().splitlines()
    if len(lines) != 1 or not (Path(lines[0]) / "bin" / "llama-server").exists():
        raise EngineUnavailable(f"scripts/build-llama-server printed no build directory: {result.stdout!r}")
    return Build(Path(lines[0]), seconds, result.stderr)


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


def _health(port: int) -> int | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


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
        if _health(port) == 200:
            return server
        time.sleep(0.1)
    server.proc.stop(signal.SIGKILL)
    raise TimeoutError(f"llama-server not healthy after {HEALTH_TIMEOUT:.0f}s; its log ends:\n" + server.log()[-4000:])
