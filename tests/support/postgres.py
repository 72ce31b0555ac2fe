"""A real PostgreSQL server for the suite: `initdb` into a temporary folder, `pg_ctl` on a free loopback port.

Why not Docker or a shared server: CI and a developer's machine both have Debian's `postgresql` package
(`.ci/run` installs it), and a cluster of our own is fast to make (fsync off, no WAL sync), needs no
network, and can't be disturbed by (or disturb) anything else on the machine.

initdb and postgres refuse to run as root, so as root (CI) every server command runs as the
`postgres` user (`runuser -u postgres --`), and the folder is made outside pytest's root-only temp
tree and handed to that user. The server listens on 127.0.0.1 only and puts its unix socket in the
folder. Local (socket) connections are trusted; TCP connections need the password, which the DSN
carries, so the password paths (masking, libpq's own auth) are exercised for real.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.procs import free_port

SERVER_USER = "postgres"
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 30


def find_bindir() -> Path | None:
    """The folder with `initdb`, `pg_ctl` and `postgres`: beside `pg_ctl` on PATH, else Debian's newest
    /usr/lib/postgresql/N/bin (Debian keeps the server binaries off PATH)."""
    candidates = []
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: _version(p.parent.name), reverse=True)
    candidates.extend(versions)
    for folder in candidates:
        if all((folder / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            return folder
    return None


def _version(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def missing_reason() -> str | None:
    """Why no server can be started here, or None when one can."""
    if find_bindir() is None:
        return "PostgreSQL's server binaries (initdb, pg_ctl) are not installed (apt-get install -y postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root, and there is no {SERVER_USER!r} user to run initdb as"
        if shutil.which("runuser") is None:
            return "running as root, and runuser (util-linux) is missing"
    return None


# The suite's server trades durability for speed; the bench (bench/store_scale.py) runs a durable one.
FAST_SETTINGS = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"


@dataclass
class PostgresServer:
    bindir: Path
    root: Path  # the temporary folder: data/, the socket, the log
    port: int
    password: str
    settings: str = FAST_SETTINGS  # the server's `-c name=value` options beyond its address and socket

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    def dsn(self, database: str = "tapfix") -> str:
        """A libpq URL over TCP with the password in it, as a user would pass it to `--db`."""
        return f"postgresql://{SERVER_USER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new empty database (over the socket, as the superuser); its DSN."""
        self._run(self.bindir / "createdb", "-h", str(self.root), "-p", str(self.port), "-U", SERVER_USER, name)
        return self.dsn(name)

    def down(self) -> None:
        """Stop the server, keeping its data: the database is down (`up` starts it again on its port)."""
        pid = self._postmaster_pid()
        if pid is not None:
            _signal_and_wait(pid, signal.SIGINT, STOP_TIMEOUT_S) or _signal_and_wait(pid, signal.SIGQUIT, 5)

    def up(self) -> None:
        """Start the server again (after `down`), on the same port, and wait until it takes connections."""
        self._run(
            self.bindir / "pg_ctl", "start", "-D", self.data, "-l", self.log, "-w", "-t", str(START_TIMEOUT_S),
            "-o", _options(self),
        )  # fmt: skip

    def restart(self) -> float:
        """`down`, then `up`; the seconds the server was away."""
        began = time.monotonic()
        self.down()
        self.up()
        return time.monotonic() - began

    def stop(self) -> None:
        """Stop the server and remove the folder. Like `pg_ctl stop -m immediate` (SIGQUIT to the postmaster:
        no shutdown checkpoint, since the data goes next), but by signal, not by a process: the session
        fixture's teardown runs inside whichever test came last, which need not carry the e2e marker."""
        try:
            pid = self._postmaster_pid()
            if pid is not None:
                _signal_and_wait(pid, signal.SIGQUIT, STOP_TIMEOUT_S) or _signal_and_wait(pid, signal.SIGKILL, 5)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def _postmaster_pid(self) -> int | None:
        try:
            first = (self.data / "postmaster.pid").read_text().split("\n", 1)[0]
        except OSError:
            return None
        return int(first) if first.strip().isdigit() else None

    def _run(self, *argv: str | Path) -> None:
        _as_server_user([str(a) for a in argv])


def _signal_and_wait(pid: int, sig: signal.Signals, timeout: float) -> bool:
    """Send `sig` to the server this fixture started; True once it is gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _options(server: PostgresServer) -> str:
    return (
        f"-c listen_addresses=127.0.0.1 -p {server.port} -c unix_socket_directories={server.root}"
        f" -c max_connections=50 {server.settings}"
    )


def _as_server_user(argv: list[str]) -> subprocess.CompletedProcess[str]:
    if os.geteuid() == 0:
        argv = ["runuser", "-u", SERVER_USER, "--", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=START_TIMEOUT_S * 2)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done


def start_postgres(database: str = "tapfix", settings: str = FAST_SETTINGS) -> PostgresServer:
    """initdb, start, create `database`. The caller stops it (`PostgresServer.stop`). `settings`: the
    server's `-c name=value` options beyond its address and socket."""
    bindir = find_bindir()
    if bindir is None:
        raise RuntimeError(missing_reason() or "no PostgreSQL binaries")
    root = Path(tempfile.mkdtemp(prefix="tapfix-pg-"))
    server = PostgresServer(bindir, root, free_port(), secrets.token_urlsafe(12), settings)
    try:
        if os.geteuid() == 0:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(root, user.pw_uid, user.pw_gid)
        root.chmod(0o700)
        pwfile = root / "pwfile"
        pwfile.write_text(server.password + "\n")
        if os.geteuid() == 0:
            os.chown(pwfile, pwd.getpwnam(SERVER_USER).pw_uid, -1)
        _as_server_user(
            [
                str(bindir / "initdb"),
                "-D",
                str(server.data),
                "-U",
                SERVER_USER,
                f"--pwfile={pwfile}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C.UTF-8",
                "--no-sync",
            ]
        )
        pwfile.unlink()
        server.up()
        server.create_database(database)
    except Exception as e:
        log = server.log.read_text(errors="replace")[-2000:] if server.log.exists() else "(no log)"
        server.stop()
        raise RuntimeError(f"PostgreSQL did not start: {e}\nits log ends:\n{log}") from e
    return server
