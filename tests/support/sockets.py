"""The TCP sockets a process holds, read from /proc, and their options, read through a copy of the socket.

For tests that check how tapfix talks to its peers from outside the process: which connections it holds
while a stream is open (`tcp_sockets`), and whether Nagle's algorithm is off on them (`option`: the
socket is duplicated into this process with pidfd_getfd(2), Linux 5.6 and later, allowed for a child
process of the caller).
"""

from __future__ import annotations

import ctypes
import os
import socket
from dataclasses import dataclass
from pathlib import Path

LISTEN, ESTABLISHED = "0A", "01"
_PIDFD_GETFD = 438  # the syscall's number on x86_64 and arm64 alike (the generic table)


@dataclass(frozen=True)
class TcpSocket:
    fd: int
    local: tuple[str, int]
    remote: tuple[str, int]
    state: str  # /proc/net/tcp's hex state: LISTEN, ESTABLISHED, ...


def _address(field: str) -> tuple[str, int]:
    host, port = field.split(":")
    if len(host) == 8:
        ip = socket.inet_ntop(socket.AF_INET, bytes.fromhex(host)[::-1])
    else:  # /proc/net/tcp6: four 32-bit words, each in host byte order
        raw = b"".join(bytes.fromhex(host[i : i + 8])[::-1] for i in range(0, 32, 8))
        ip = socket.inet_ntop(socket.AF_INET6, raw)
    return ip, int(port, 16)


def tcp_sockets(pid: int) -> list[TcpSocket]:
    """Every TCP socket process `pid` has open, with its file descriptor."""
    inodes: dict[str, int] = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes[target[8:-1]] = int(fd)
    found = []
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                found.append(TcpSocket(inodes[fields[9]], _address(fields[1]), _address(fields[2]), fields[3]))
    return found


def option(pid: int, fd: int, level: int, name: int) -> int:
    """getsockopt(level, name) of socket `fd` of process `pid`, read through a duplicate of it."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    try:
        copy = libc.syscall(_PIDFD_GETFD, pidfd, fd, 0)
        if copy < 0:
            raise OSError(ctypes.get_errno(), f"pidfd_getfd of fd {fd} in process {pid}")
    finally:
        os.close(pidfd)
    with socket.socket(fileno=copy) as sock:
        return sock.getsockopt(level, name)
