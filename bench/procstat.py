"""CPU and memory of other processes, read from /proc (never wall time).

Why: on a shared two-core machine wall time measures the neighbours; CPU time charged to the proxy
process does not. `cpu_ns` sums /proc/PID/task/*/schedstat (ns on CPU, every live thread: the
event loop and tapfix's writer thread); `ticks_ns` is /proc/PID/stat utime+stime (clock ticks,
includes exited threads) and is kept as a cross-check. A load's cost is read only once the process
is idle again (`wait_idle`), because tapfix's writer thread stores the captures after the load.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def cpu_ns(pid: int) -> int:
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return 0
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
    return total


def task_cpu_ns(pid: int) -> dict[int, int]:
    """CPU ns per live thread (TID → ns), e.g. to split the event loop from tapfix's writer thread."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
    return out


def stat_fields(pid: int) -> list[bytes]:
    """/proc/PID/stat after the command name: `[0]` the state, `[1]` the parent, `[3]` the session,
    `[11] + [12]` utime + stime in ticks, `[19]` the start time in ticks after boot."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()


def processes() -> Iterator[tuple[int, list[bytes]]]:
    """Every live process: its PID and `stat_fields` (one that ends meanwhile is left out)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            yield int(entry), stat_fields(int(entry))
        except OSError:
            continue


def ticks_ns(pid: int) -> int:
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) * TICK_NS


def memory_kb(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak over the process's life), in kB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0])
    return out


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def snapshot(pids: dict[str, int]) -> dict[str, int]:
    return {name: cpu_ns(pid) for name, pid in pids.items()}


def wait_idle(pids: dict[str, int], *, window_s: float = 0.15, quiet_ns: int = 1_500_000, max_s: float = 15.0) -> float:
    """Block until every process used < quiet_ns of CPU over one window (writer flushed); seconds waited."""
    start = time.monotonic()
    before = snapshot(pids)
    while time.monotonic() - start < max_s:
        time.sleep(window_s)
        now = snapshot(pids)
        if all(now[k] - before[k] < quiet_ns for k in pids):
            return time.monotonic() - start
        before = now
    return time.monotonic() - start


def idle_rate_ns_per_s(pid: int, seconds: float = 1.0) -> float:
    """Background CPU of an idle process (timers, keep-alives), to check it is negligible."""
    a = cpu_ns(pid)
    time.sleep(seconds)
    return (cpu_ns(pid) - a) / seconds


def machine_busy_ns() -> int:
    """CPU time all processes used so far (user+nice+system+irq+softirq+steal of every core)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    return (fields[0] + fields[1] + fields[2] + fields[5] + fields[6] + fields[7]) * TICK_NS


def self_cpu_ns() -> int:
    return ticks_ns(os.getpid())


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of process `pid` onto `cpus` (what `taskset -a -p` does); threads it starts later
    inherit the mask of the thread that starts them."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, FileNotFoundError):
            pass
