"""What starting tapfix costs: `tapfix --help`, `tapfix captures list`, and `tapfix run` to its first answer.

Why: a command a user or a script runs often should not pay for modules it never uses (QA: `tapfix --help`
took 0.45 s of CPU, most of it sqlite_utils importing numpy; `tapfix run` 1.2 s of CPU to its first answer,
then idled at 116 MB). CPU is the child's own (user + system from `wait4`), never wall time; memory is
VmRSS/VmHWM from /proc. For `run`, a `tapfix mock` upstream answers one streamed chat request sent the
moment the port opens; CPU is read when that answer has arrived, RSS after the process idled a second.
Also reported: whether numpy ended up in the process (its shared object mapped). tapfix's modules are
byte-compiled first (as an installed wheel is, and as scripts/test does): with PYTHONDONTWRITEBYTECODE
set, a source tree would otherwise be compiled again at every start and that would be most of the cost.

    .venv/bin/python bench/startup.py [--tapfix PATH] [--runs N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from procstat import cpu_ns, memory_kb, wait_idle  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_cpu(argv: list[str]) -> tuple[float, int]:
    """(CPU seconds, peak RSS kB) of one run of argv, from wait4's rusage."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv} exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def _maps_numpy(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "numpy" in f.read()
    except OSError:
        return False


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"process exited {proc.returncode} before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise SystemExit(f"nothing listened on {port}")


def _first_answer(port: int) -> None:
    body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "Say hello"}]}).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    if b"[DONE]" not in data:
        raise SystemExit(f"no whole answer: {data[:300]!r}")


def run_start(tapfix: str, tmp: Path) -> dict[str, float]:
    mock_port, port = _free_port(), _free_port()
    mock = subprocess.Popen([tapfix, "mock", "--listen", f"127.0.0.1:{mock_port}"], stdout=subprocess.DEVNULL)
    proxy = None
    try:
        _wait_port(mock_port, mock)
        argv = [tapfix, "run", "--upstream", f"http://127.0.0.1:{mock_port}", "--listen", f"127.0.0.1:{port}"]
        argv += ["--db", str(tmp / f"c-{port}.db")]
        proxy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(port, proxy)
        _first_answer(port)
        first = cpu_ns(proxy.pid) / 1e9
        wait_idle({"proxy": proxy.pid})
        time.sleep(1.0)
        mem = memory_kb(proxy.pid)
        return {
            "cpu_to_first_answer_s": first,
            "idle_rss_mb": mem["VmRSS"] / 1024,
            "peak_rss_mb": mem["VmHWM"] / 1024,
            "numpy_loaded": float(_maps_numpy(proxy.pid)),
        }
    finally:
        for p in (proxy, mock):
            if p is not None:
                p.terminate()
                p.wait(15)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tapfix", default=str(ROOT / ".venv" / "bin" / "tapfix"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    out: dict[str, dict[str, float]] = {}
    python = str(Path(args.tapfix).parent / "python")
    subprocess.run([python, "-m", "compileall", "-q", "-j", "0", str(ROOT / "proxy"), str(ROOT / "addons")], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "empty.db"
        make = (
            "import sys; from tapfix.proxy.store.sqlite.database import open_for_writing as o; o(sys.argv[1]).close()"
        )
        subprocess.run([python, "-c", make, str(db)], check=True)
        for name, argv in (
            ("tapfix --help", [args.tapfix, "--help"]),
            ("tapfix captures list", [args.tapfix, "captures", "list", "--db", str(db)]),
        ):
            runs = [_child_cpu(argv) for _ in range(args.runs)]
            cpu = [c for c, _ in runs]
            out[name] = {
                "cpu_s_median": statistics.median(cpu),
                "cpu_s_min": min(cpu),
                "max_rss_mb": runs[-1][1] / 1024,
            }
        starts = [run_start(args.tapfix, Path(tmp)) for _ in range(max(1, args.runs // 2))]
        out["tapfix run"] = {key: statistics.median(s[key] for s in starts) for key in starts[0]}
    for name, values in out.items():
        print(f"{name:22} " + "  ".join(f"{k}={v:.3f}" for k, v in values.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
