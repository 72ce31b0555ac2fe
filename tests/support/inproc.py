"""The in-process tier's machinery: the real proxy and the real mock served by threads of the test process,
on port 0, and the command line through click's CliRunner. The calls mirror tests/support/procs.py
(`start_proxy`, `start_mock`, `mock_and_proxy`, `cli`, the handle's `.url`, `.port`, `.extra["db"]`,
`.log()`, `.stop()`), so a test moves between the tiers by its imports.

The proxy is `tapfix run`'s own path minus the process: its options parsed by the `run` command and
taken through its callback (what its decorators do, such as a deprecated spelling mapped to its option
and the warning that says so, happens here too; its checks, `checked`, too: the settings are what it
hands `run_proxy`), `prepared` (store, upstreams, policy, the capture writer's thread), `serve` on an
event loop of its own thread, and on stop what SIGTERM does (the shutdown grace) and what the
process does before it exits (`drain`: the writer's queue, the exports). What a process gave for
free, each owned here:

- mitmproxy's process-wide state: a master sets `mitmproxy.ctx.master` and `ctx.options`, which its
  connection handlers read, so **one in-process proxy runs at a time**. A module's proxy (`shared`, as
  the `proxy` fixture starts it) steps aside while a test runs its own and comes back (same port, same
  store) when next used;
  any other second start while one runs is an error that says so. `serve` installs tapfix's two
  patches of mitmproxy's HTTP/1 server once (addons/runner/reset_tail.py, raw_head.py); they stay, as
  in a process, and only act on connections that carry tapfix's markers. Each master starts from
  mitmproxy's option defaults: its own `Options`.
- the CA folder: `tapfix_ca_home` (tests/conftest.py), one per test session, under XDG_CONFIG_HOME.
- the capture writer's thread: started by `prepare`, stopped and drained by `stop` (module fixtures
  stop their proxy at the end of the module).
- logging: the proxy's lines (`tapfix.*` at INFO, mitmproxy's and the rest at WARNING, INFO with
  --verbose, as cli/run.py sets them up) go to the handle's log file while it runs; its handler and the
  levels are put back on stop. The mock's uvicorn configures its own loggers when it starts (it did so
  in the `tapfix mock` process too); nothing of theirs reaches a proxy's log but warnings.
- environment variables a process would have been given (`env=`): set while the proxy runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import click
from click.testing import CliRunner
from tapfix.addons.runner import event_loop
from tapfix.addons.runner.master import Serving, drain, serve
from tapfix.proxy.cli.main import main, mock_options
from tapfix.proxy.cli.run import prepared
from tapfix.proxy.cli.run import run as run_command
from tapfix.proxy.config.settings import Settings

from tests.support.procs import mock_then_proxy

if TYPE_CHECKING:
    from tapfix.proxy.cli.demo import MockThread

run_module = sys.modules["tapfix.proxy.cli.run"]  # the module whose run_proxy the command calls

START_TIMEOUT_S = 20.0
MOCK_THREAD = "tapfix-demo-mock"  # what proxy/cli/demo.py names the mock's thread
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"  # cli/run.py's
STARTED: list[Any] = []  # every in-process proxy and mock, for the logs a failing test shows (tests/conftest.py)


class _OnLoopback:
    """What the in-process servers answer as a process handle does (tests/support/procs.py's Proc)."""

    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class OneAtATime(RuntimeError):
    """A second in-process proxy was started while one runs (mitmproxy's ctx is process-wide)."""


class _ProxyLog(logging.Handler):
    """The proxy's log file: tapfix's lines at INFO, the rest at the level `tapfix run` gives them.

    A process's log holds what that process logged; here the test shares the process, so what the test's
    side logs stays out: its main thread once the proxy is prepared (the test, the CLI through CliRunner),
    the in-process mocks' threads, and the HTTP clients' lines (httpx, the SDKs) unless the proxy's own
    thread made them (its deep health probe does)."""

    CLIENTS = ("httpx", "httpcore", "openai", "anthropic")

    def __init__(self, path: Path, verbose: bool) -> None:
        super().__init__(logging.INFO)
        self.stream = open(path, "a", encoding="utf-8")
        self.floor = logging.INFO if verbose else logging.WARNING
        self.setFormatter(logging.Formatter(LOG_FORMAT))
        self.serving_thread: int | None = None  # set once the proxy's thread exists
        self.preparing = True  # `prepare` runs on the test's thread: what it logs is the proxy's

    def emit(self, record: logging.LogRecord) -> None:
        test_side = record.thread == threading.main_thread().ident and not self.preparing
        if test_side or (record.threadName or "").startswith(MOCK_THREAD):
            return
        if record.name.split(".")[0] in self.CLIENTS and record.thread != self.serving_thread:
            return
        mine = record.name == "tapfix" or record.name.startswith("tapfix.")
        if mine or record.levelno >= self.floor:
            self.stream.write(self.format(record) + "\n")
            self.stream.flush()

    def close(self) -> None:
        self.stream.close()
        super().close()


@contextmanager
def _environment(env: dict[str, str] | None) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in env or {}}
    os.environ.update(env or {})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _run_settings(args: list[str], log_path: Path) -> Settings:
    """What `tapfix run ARGS` hands `run_proxy`: the command's own callback runs (its decorators, its checks),
    with `run_proxy` standing in to take the settings. What it says on stderr goes to the log, as a
    process's stderr does."""
    taken: list[Settings] = []

    def take(settings: Settings, banner: Any = None) -> int:
        taken.append(settings)
        return 0

    original = run_module.run_proxy
    run_module.run_proxy = take
    try:
        with open(log_path, "a", encoding="utf-8") as err, contextlib.redirect_stderr(err):
            with run_command.make_context("run", args) as ctx:
                ctx.invoke(run_command.callback, **ctx.params)  # type: ignore[arg-type]
    except SystemExit:
        pass
    finally:
        run_module.run_proxy = original
    assert taken, f"`tapfix run {' '.join(args)}` ended before it had settings"
    return taken[0]


@dataclass
class InprocProxy(_OnLoopback):
    """`tapfix run` served by a thread of the test process.

    A `shared` proxy (a module's, started by a fixture) steps aside when a test starts one of its own, and
    comes back, on the same store and port, when it is next used (`.url`, `.port`)."""

    args: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    shared: bool = False
    returncode: int | None = None
    runtime: Any = None
    settings: Any = None
    _port: int = 0
    _aside: bool = False
    _serving: Serving | None = None
    _thread: threading.Thread | None = None
    _error: BaseException | None = None
    _handler: _ProxyLog | None = None
    _env: Any = None
    _levels: tuple[int, int] = (logging.WARNING, logging.NOTSET)  # the root's and tapfix's, put back at stop
    running: ClassVar[InprocProxy | None] = None  # the one that runs now (see `start`)

    @property
    def port(self) -> int:
        if self._aside:
            self._aside = False
            self.start()
        return self._port

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> InprocProxy:
        current = InprocProxy.running
        if current is not None and current is not self and current.alive():
            if not current.shared:
                raise OneAtATime(
                    f"an in-process proxy already runs ({current.url}, {current.args}): mitmproxy's ctx is "
                    "process-wide, so stop it first (or start this one in the process tier)"
                )
            current.stop()
            current._aside = True
        self.returncode, self._serving, self._thread, self._error = None, None, None, None
        listen = any(a == "--listen" or a.startswith("--listen=") for a in self.args)
        # Back from stepping aside: on its old port, so what a test's clients cached still reaches it.
        args = self.args if listen else [*self.args, "--listen", f"127.0.0.1:{self._port}"]
        self._env = _environment(self.env)
        self._env.__enter__()
        try:
            self.settings = _run_settings(list(args), self.log_path)
            self._handler = _ProxyLog(self.log_path, self.settings.verbose)
            root, tapfix_log = logging.getLogger(), logging.getLogger("tapfix")
            root.addHandler(self._handler)
            self._levels = (root.level, tapfix_log.level)
            tapfix_log.setLevel(logging.INFO)  # as cli/run.py sets them up
            if self.settings.verbose:
                root.setLevel(logging.INFO)
            _, _, self.runtime = prepared(self.settings)
            listening = threading.Event()

            def on_listening(serving: Serving) -> None:
                self._serving = serving
                listening.set()

            def serve_here() -> None:
                try:
                    asyncio.run(
                        serve(self.settings, self.runtime, listening=on_listening), loop_factory=event_loop.factory()
                    )
                except BaseException as e:  # reported by start (before listening) or wait
                    self._error = e
                finally:
                    listening.set()

            InprocProxy.running = self
            self._thread = threading.Thread(target=serve_here, name=f"tapfix-inproc-{self.log_path.stem}", daemon=True)
            self._thread.start()
            self._handler.serving_thread, self._handler.preparing = self._thread.ident, False
            if self not in STARTED:
                STARTED.append(self)
            if not listening.wait(START_TIMEOUT_S) or self._serving is None:
                self.stop()
                raise RuntimeError(f"the in-process proxy did not listen: {self._error!r}\n{self.log()[-4000:]}")
        except BaseException:
            self._release()
            raise
        self._port = self._serving.port
        return self

    def terminate(self) -> None:
        """What SIGTERM (or Ctrl-C) does, at once: the first starts the shutdown grace, another ends it."""
        if self._serving is not None and self.alive():
            self._serving.stop()

    def wait(self, timeout: float = 30.0) -> int:
        """Until the proxy stopped serving, then what the process does before it exits (drain); the exit code
        `tapfix run` would give. TimeoutError if it still serves after `timeout`."""
        if self.returncode is not None:
            return self.returncode
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the in-process proxy on {self._port} still serves after {timeout}s")
        failed = drain(self.runtime) if self.runtime is not None else None
        if failed:
            logging.getLogger("tapfix").error("tapfix: %s", failed)
        self.returncode = 2 if isinstance(self._error, OSError) else 0
        self._release()
        if self._error is not None and not isinstance(self._error, (OSError, KeyboardInterrupt)):
            raise RuntimeError(f"the in-process proxy on {self._port} failed") from self._error
        return self.returncode

    def stop(self, timeout: float = 30.0) -> int:
        """What SIGTERM does (the grace), a second one if the grace outlives `timeout`, then drain."""
        self._aside = False
        self.terminate()
        try:
            return self.wait(timeout)
        except TimeoutError:
            self.terminate()
            return self.wait(10)

    def _release(self) -> None:
        if self._handler is not None:
            root = logging.getLogger()
            root.removeHandler(self._handler)
            self._handler.close()
            root.setLevel(self._levels[0])
            logging.getLogger("tapfix").setLevel(self._levels[1])
            self._handler = None
        if self._env is not None:
            self._env.__exit__(None, None, None)
            self._env = None
        if InprocProxy.running is self:
            InprocProxy.running = None


def start(args: list[str], log_path: Path, env: dict[str, str] | None = None, shared: bool = False) -> InprocProxy:
    """`tapfix run ARGS` in this process (`--listen 127.0.0.1:0` unless the args say where)."""
    return InprocProxy(list(args), log_path, env, shared=shared).start()


def start_proxy(
    tmp: Path,
    upstream: str,
    *args: str,
    db: Path | None = None,
    env: dict[str, str] | None = None,
    shared: bool = False,
) -> InprocProxy:
    """`tapfix run --upstream UPSTREAM --db DB ARGS` in this process; `shared`: a module's proxy (see InprocProxy)."""
    db = db or tmp / "captures.db"
    handle = InprocProxy(["--upstream", upstream, "--db", str(db), *args], _log_path(tmp, "proxy"), env, shared=shared)
    handle.extra["db"] = db
    return handle.start()


def _log_path(tmp: Path, kind: str) -> Path:
    k = 0
    while (tmp / f"{kind}-inproc-{k}.log").exists():
        k += 1
    path = tmp / f"{kind}-inproc-{k}.log"
    path.touch()
    return path


@dataclass
class InprocMock(_OnLoopback):
    """`tapfix mock` served by a uvicorn thread of the test process (as `tapfix demo` serves it)."""

    mock: MockThread
    log_path: Path
    port: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def server(self) -> Any:
        """The uvicorn server (its `config.loaded_app` is the app a test may wrap)."""
        return self.mock.server

    def alive(self) -> bool:
        return any(s.is_serving() for s in self.server.servers)

    def stop(self) -> int:
        """Stops listening at once, as a killed process would, and returns once its thread ended: the responses
        still open get uvicorn's graceful second, and what uvicorn says of those it cancels is said during
        the test that stopped it (in its captured output), not after the session's summary."""
        self.mock.stop()
        return 0


def start_mock(tmp: Path, *args: str) -> InprocMock:
    """`tapfix mock ARGS` in this process, on a port of its own."""
    from tapfix.proxy.cli.demo import start_mock_thread

    command = main.get_command(click.Context(main), "mock")
    assert command is not None
    with command.make_context("mock", ["--listen", "127.0.0.1:0", *args]) as ctx:
        params = dict(ctx.params)
        host, _ = params.pop("listen")
        opts = mock_options(**params)
    mock = start_mock_thread(host, 0, opts)
    handle = InprocMock(mock, _log_path(tmp, "mock"), mock.port)
    STARTED.append(handle)
    return handle


def mock_and_proxy(
    tmp: Path, scenario: str | dict[str, Any], *proxy_args: str, shared: bool = False
) -> AbstractContextManager[tuple[InprocMock, InprocProxy]]:
    """The mock with `--scenario` and the proxy in front of it, both in the test process and stopped at the end;
    `shared`: a module's proxy (see InprocProxy)."""
    return mock_then_proxy(start_mock, start_proxy, tmp, scenario, *proxy_args, shared=shared)


class WouldServe(RuntimeError):
    """A command run through `cli` got past its checks and went on to serve (it would serve here forever)."""


@contextmanager
def _no_serving(args: tuple[str, ...]) -> Iterator[None]:
    """Each way a command starts serving (the proxy's master loop, the mock's and the browser's uvicorn) raises
    WouldServe while `cli` runs: a refusal that stopped refusing fails its test instead of hanging it."""
    import uvicorn
    from tapfix.addons.runner import master
    from tapfix.proxy import mock

    def refuse(*_: Any, **__: Any) -> Any:
        raise WouldServe(f"`tapfix {' '.join(args)}` went on to serve: cli() runs commands that end")

    saved = [(master, "run", master.run), (mock, "serve", mock.serve), (uvicorn, "run", uvicorn.run)]
    for owner, name, _ in saved:
        setattr(owner, name, refuse)
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def cli(
    *args: str,
    env: Mapping[str, str | None] | None = None,
    input: bytes | None = None,
    cwd: Path | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """`tapfix ARGS` through click's CliRunner: the result as a finished process gives it (exit code,
    stdout and stderr bytes). An exception the command let through fails the test with its traceback,
    where the process would have printed it and exited 1. `env`: set while it runs (None: unset); `cwd`:
    the working directory while it runs. Only commands that end: one that gets as far as serving (`run`,
    `mock`, `browse`, `demo` past their checks) raises WouldServe. `timeout`: taken for procs.cli's
    signature; nothing here waits on a process."""
    del timeout
    with _no_serving(args), contextlib.chdir(cwd or Path.cwd()):
        result = CliRunner().invoke(main, list(args), env=env, input=input, prog_name="tapfix")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["tapfix", *args], result.exit_code, result.stdout_bytes, result.stderr_bytes)
