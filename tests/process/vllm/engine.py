"""The real vLLM for the vLLM suite (tests/process/vllm/, marker `vllm`): its CPU build, installed once into a cache
outside the clone by scripts/install-vllm, serving the tiny Qwen3 model tests/process/vllm/tiny_qwen3.py writes.

The fixtures in conftest.py call these. How a server is started, and why each setting is there, is in
`SERVER_ENV` and `serve_argv`; docs/realengine.md has the numbers.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.process.engine_suite import ROOT, Provisioned, cache_root, http_status, run_cache_script
from tests.process.vllm import tiny_qwen3
from tests.support.procs import free_port

INSTALL_SCRIPT = ROOT / "scripts" / "install-vllm"
INSTALL_TIMEOUT = 1800  # a cold install took 3 to 8 minutes on 2 shared cores; the cuda route downloads 3 GB
NO_PYTHON = 3  # the script's exit status when there is no Python 3.11
READY_TIMEOUT = 600.0  # a start took 60 to 120 s on 2 cores shared with the suite (33 s on a quiet machine)
SERVED = Path(__file__).resolve().parent / "served"  # the modules vLLM imports: the logits processor, the switch
MODEL = "tiny-qwen3"  # the served model name
MAX_MODEL_LEN = tiny_qwen3.CONTEXT_LENGTH
KV_CACHE_BYTES = 128 * 2**20  # 256k tokens of the tiny model: 4 sequences of 32k fit; 1 GiB would be 2M
LOGITS_PROCESSOR = "tapfix_forcing:ForcedText"
SWITCH_PARSER = "tapfix_switch"

# The environment of every server. CPU build: the device, no core pinning (cores are shared), loopback only,
# offline. OMP_NUM_THREADS=1: vLLM asks torch for one thread, but its CPU worker can't change the count after
# binding, and an OpenMP thread spinning beside each step took 50-80 ms of CPU per token on 2 busy cores
# (1 ms without). VLLM_ENABLE_V1_MULTIPROCESSING=0 with `--distributed-executor-backend uni`: the model runs
# in the engine core process instead of a third process (one start's imports and a hop per step fewer).
SERVER_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_HOST_IP": "127.0.0.1",
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


@dataclass(frozen=True)
class Install(Provisioned):
    """What scripts/install-vllm produced (or found in its cache), and how long the call took."""

    @property
    def vllm(self) -> Path:
        return self.dir / "venv" / "bin" / "vllm"

    @property
    def route(self) -> str:
        """`cpu` (the CPU torch wheel), `cuda` (PyPI's torch with its nvidia wheels) or `external`."""
        return (self.dir / "route").read_text().strip()

    @property
    def template(self) -> Path:
        return self.dir / "templates" / tiny_qwen3.TEMPLATE_NAME


def install_vllm(timeout: float = INSTALL_TIMEOUT) -> Install:
    """Run the install script (a quick print of the directory when the cache holds the install)."""
    installed = run_cache_script(INSTALL_SCRIPT, timeout, cannot_status=NO_PYTHON, must_hold="venv/bin/vllm")
    return Install(installed.dir, installed.seconds, installed.output)


def model_dir(install: Install) -> Path:
    """The tiny model in the cache under its recorded digest, written (atomically) when it isn't there whole."""
    path = cache_root() / "tiny-qwen3" / tiny_qwen3.MODEL_SHA256[:16]
    if path.is_dir() and tiny_qwen3.digest_of(path) == tiny_qwen3.MODEL_SHA256:
        return path
    partial = path.with_name(f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    tiny_qwen3.write_model(partial, install.template.read_text())
    shutil.rmtree(path, ignore_errors=True)
    partial.rename(path)  # a reader sees the old directory, none, or the whole new one
    return path


def serve_argv(install: Install, model: Path, port: int, *args: str) -> list[str]:
    """`vllm serve` as the tests run it; `args` (the parsers) go last. float32: with bf16 weights this CPU
    build falls back from oneDNN to a slower matmul; the model is tiny either way."""
    return [
        str(install.vllm),
        "serve",
        str(model),
        *("--host", "127.0.0.1", "--port", str(port), "--served-model-name", MODEL),
        *("--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", "4"),
        *("--kv-cache-memory-bytes", str(KV_CACHE_BYTES), "--enforce-eager"),
        *("--distributed-executor-backend", "uni"),
        # The sampling defaults are the request's and vLLM's own, not the model's generation_config.json:
        # what tapfix injects from that file must show in the request log as what arrived.
        *("--generation-config", "vllm"),
        *("--logits-processors", LOGITS_PROCESSOR, "--enable-log-requests"),
        *args,
    ]


def switch_parser_args() -> list[str]:
    """Automatic tool choice with the per-request parser switch (served/tapfix_parser_switch.py)."""
    plugin = SERVED / "tapfix_parser_switch.py"
    return ["--enable-auto-tool-choice", "--tool-parser-plugin", str(plugin), "--tool-call-parser", SWITCH_PARSER]


@dataclass
class VllmServer:
    """`vllm serve` on loopback in a process group of its own (API server and engine core), stopped by it."""

    name: str
    popen: subprocess.Popen
    port: int
    log_path: Path
    argv: list[str]
    started: float = field(default_factory=time.monotonic)
    ready_seconds: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> VllmServer:
        """Until `GET /v1/models` answers 200 (vLLM opens the port only once the engine is up)."""
        deadline = self.started + timeout
        while self.ready_seconds is None:
            if self.popen.poll() is not None:
                raise RuntimeError(
                    f"vllm ({self.name}) exited with {self.popen.returncode} before it answered; its log ends:\n"
                    + self.log()[-6000:]
                )
            if http_status(self.port, "GET", "/v1/models", timeout=5) == 200:
                self.ready_seconds = time.monotonic() - self.started
                break
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"vllm ({self.name}) not ready after {timeout:.0f}s; its log ends:\n" + self.log()[-6000:]
                )
            time.sleep(0.5)
        return self

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)  # its own group: the API server and the engine core
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)
            except ProcessLookupError:
                pass
        try:  # the engine core may outlive the API server by a moment: the group goes with it
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return self.popen.returncode


def launch(install: Install, model: Path, tmp: Path, name: str, *args: str) -> VllmServer:
    """Start `vllm serve` on a free loopback port without waiting for it (`wait_ready` does)."""
    port = free_port()
    argv = serve_argv(install, model, port, *args)
    env = {**os.environ, **SERVER_ENV, "PYTHONPATH": str(SERVED)}
    log_path = tmp / f"vllm-{name}-{port}.log"
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return VllmServer(name, popen, port, log_path, argv)
