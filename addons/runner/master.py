"""Runs mitmproxy in this process through its Python API, with tapfix's addon chain."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mitmproxy import options
from mitmproxy.master import Master
from tapfix.addons import default_addons
from tapfix.addons.chain import collapse
from tapfix.addons.runner import client_write, event_loop, raw_head, reset_tail
from tapfix.addons.runner.runtime import Runtime
from tapfix.addons.shutdown import Shutdown
from tapfix.proxy.config.settings import Settings
from tapfix.proxy.config.upstream import UpstreamTarget
from tapfix.proxy.net import is_loopback
from tapfix.proxy.store.locator import StoreLocator
from tapfix.proxy.store.writer import CaptureWriter

log = logging.getLogger("tapfix")


def confdir() -> Path:
    """mitmproxy's CA lives under the user's config dir, readable by the user only.

    The first start makes the CA. mitmproxy writes its files one by one, so a second tapfix starting
    at that moment (a fleet on one host, two test workers) could load a half-written key: the CA is
    made here under a lock, and mitmproxy then only loads it."""
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    path = base / "tapfix" / "mitmproxy"
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    if not (path / f"{options.CONF_BASENAME}-ca.pem").exists():
        import fcntl

        from mitmproxy.certs import CertStore

        with open(path / ".ca.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            # Makes it unless the lock's last holder did; mitmproxy's own basename and default key size.
            CertStore.from_store(path, options.CONF_BASENAME, options.KEY_SIZE)
    return path


def build_runtime(
    settings: Settings,
    policy: Any = None,
    targets: dict[str, UpstreamTarget] | None = None,
    writer: CaptureWriter | None = None,
    export: Any = None,
) -> Runtime:
    """The runtime of one proxy process; `export`: the OTLP export settings (telemetry/config.py), None: off."""
    all_targets = dict(targets or {})
    default = all_targets.get("default")
    if default is None and settings.upstream:
        default = UpstreamTarget.parse(settings.upstream)
        all_targets[default.name] = default
    if default is None and all_targets and settings.mode == "reverse":
        default = next(iter(all_targets.values()))
    runtime = Runtime(settings=settings, writer=writer, default_target=default, policy=policy, targets=all_targets)
    runtime.export = export
    runtime.intercept_hosts = set(settings.intercept) or {t.host for t in all_targets.values()}
    config = getattr(policy, "config", None)
    if config is not None:
        from tapfix.proxy.regenerate.eligibility import Admissions, AdmissionSettings

        defaults = AdmissionSettings()
        runtime.admissions = Admissions(
            {
                name: AdmissionSettings(
                    u.regenerate_concurrency or defaults.concurrency, u.regenerate_per_minute or defaults.per_minute
                )
                for name, u in config.upstreams.items()
            }
        )
    install_telemetry(runtime)
    install_replay(runtime)
    return runtime


def install_replay(runtime: Runtime) -> None:
    """Issue 36: where a model replays reasoning, the turns it answered are remembered (`replay_turns`,
    noted by the recorder) and the request policy looks them up there."""
    config = getattr(runtime.policy, "config", None)
    if config is None:
        return
    models = [*config.models.values(), *([config.quick_model] if config.quick_model else [])]
    if any(m.replay_reasoning for m in models):
        from tapfix.proxy.store.replay_turns import RecentTurns

        runtime.replay_turns = RecentTurns()
        runtime.policy.turns = runtime.replay_turns


def install_telemetry(runtime: Runtime) -> None:
    """Issue 20: one aggregation of the metrics, fed by one writer observer that builds each exchange's
    `Turn` once for every sink, and served two ways: `/tapfix/metrics` always (`runtime.metrics`); with
    OTLP export on, an export thread of the same numbers, and the span exporter (`runtime.telemetry`)."""
    from tapfix.proxy.telemetry import semconv
    from tapfix.proxy.telemetry.aggregate import Aggregation
    from tapfix.proxy.telemetry.metrics import CATALOGUES, QUEUE_DEPTH, Labeller
    from tapfix.proxy.telemetry.observe import TurnFanout
    from tapfix.proxy.telemetry.prometheus import PrometheusExposition
    from tapfix.proxy.telemetry.turn import TurnContext

    writer = runtime.writer

    def queue_depth() -> float:
        return float(writer.health()["queue_depth"]) if writer is not None else 0.0

    export = runtime.export
    # TAPFIX_GENAI_SEMCONV (`run` checks it at the command line): the conventions' names, or v1.41.0's.
    try:
        naming = export.naming if export is not None else semconv.naming_of(os.environ)
    except ValueError as e:
        from tapfix.addons.runner.setup import StartupError

        raise StartupError(str(e)) from e
    labeller = Labeller.for_config(getattr(runtime.policy, "config", None))
    aggregation = Aggregation(labeller, {QUEUE_DEPTH: queue_depth}, CATALOGUES[naming])
    runtime.metrics = PrometheusExposition(aggregation)
    if writer is None:
        return
    context = TurnContext(
        engine_of=runtime.engine_of,
        capture_content=export is not None and export.captures_content,
        request_body=export is not None,
    )
    fanout = runtime.fanout = TurnFanout(context)
    fanout.add(aggregation)
    runtime.telemetry_health["fanout"] = fanout.health
    if export is not None:
        from tapfix.addons.runner.setup import StartupError

        try:
            from tapfix.proxy.telemetry.export import SpanExport
            from tapfix.proxy.telemetry.otel_metrics import OtlpMetrics
        except ImportError as e:
            raise StartupError(f"--otlp needs the OpenTelemetry packages ({e.name}): pip install 'tapfix[otel]'") from e
        meters = OtlpMetrics.exporting(aggregation, export)
        fanout.add_closer(meters.shutdown)
        runtime.telemetry_health["otlp_metrics"] = meters.health
        spans = runtime.telemetry = SpanExport(export)
        fanout.add(spans.submit, close=spans.close)
        runtime.telemetry_health["spans"] = spans.health
    writer.observers.append(fanout)


def mitm_options(settings: Settings, runtime: Runtime) -> dict[str, Any]:
    if settings.mode == "reverse":
        if runtime.default_target is None:
            raise ValueError("reverse mode needs an upstream (--upstream URL or a config with upstreams)")
        mode = [f"reverse:{runtime.default_target.origin}@{settings.listen_host}:{settings.listen_port}"]
    else:
        mode = [f"regular@{settings.listen_host}:{settings.listen_port}"]
    opts: dict[str, Any] = dict(
        mode=mode,
        connection_strategy="lazy",
        ssl_insecure=settings.insecure,
        termlog_verbosity="warn",
        tcp_timeout=settings.idle_timeout,
        # Reverse mode: the capture keeps the Host the client sent (mitmproxy would put the upstream's
        # there before any hook); the router names the upstream in what it forwards. Regular mode: no-op.
        keep_host_header=settings.mode == "reverse",
    )
    if settings.upstream_ca:
        opts["ssl_verify_upstream_trusted_ca"] = str(settings.upstream_ca)
    if settings.mode == "regular" and runtime.intercept_hosts:
        opts["allow_hosts"] = [_host_pattern(h) for h in sorted(runtime.intercept_hosts)]
    return opts


def _host_pattern(host: str) -> str:
    import re

    return rf"^{re.escape(host)}(:\d+)?$"


@dataclass
class Serving:
    """A proxy that listens, for whoever started it off the main thread (the in-process test tier): the
    addresses it listens on (port 0 picks one) and a thread-safe stop that does what SIGTERM does."""

    master: Master
    shutdown: Shutdown
    addresses: list[Any]

    @property
    def port(self) -> int:
        return int(self.addresses[0][1])

    def stop(self) -> None:
        """The first call starts the shutdown grace, another ends it (as a second SIGTERM would)."""
        self.master.event_loop.call_soon_threadsafe(self.shutdown.signal, self.master)


async def serve(
    settings: Settings,
    runtime: Runtime,
    *,
    ready: Callable[[], None] | None = None,
    listening: Callable[[Serving], None] | None = None,
) -> None:
    reset_tail.install()
    raw_head.install()
    client_write.install()
    master = _mitmproxy(options.Options(confdir=str(confdir())))
    master.options.update(**mitm_options(settings, runtime))
    termlog = master.addons.get("termlog")
    if termlog is not None:  # tapfix's own lines have their handler (cli/run.py); mitmproxy's prints its own
        termlog.logger.addFilter(_not_tapfix)
    chain = default_addons(runtime)
    master.addons.add(*chain)
    collapse(master.addons)  # one entry: mitmproxy calls each entry for every event (addons/chain.py)
    shutdown = next(addon for addon in chain if isinstance(addon, Shutdown))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # the first starts the grace, another ends it
        try:
            loop.add_signal_handler(sig, shutdown.signal, master)
        except (NotImplementedError, RuntimeError, ValueError):  # pragma: no cover - not on the main thread
            pass
    task = asyncio.create_task(master.run())
    addrs = await _wait_listening(master)
    if not addrs:
        master.shutdown()
        await task
        raise OSError(f"could not listen on {settings.listen_host}:{settings.listen_port} (in use?)")
    if listening is not None:
        listening(Serving(master, shutdown, addrs))
    if ready is not None:
        ready()
    await task


def _mitmproxy(opts: options.Options) -> Master:
    """mitmproxy's master with the addons of its own that act on tapfix's traffic: the core, the proxy server,
    the layer choice, TLS, blocking public clients, h2c refusal, proxy auth, Alt-Svc rewriting, script loading
    (`-s`, addons/runner/script.py), the terminal log and the start-up error check.

    Not the rest of mitmdump's defaults (replays, rewrites, dumps, HAR, sticky cookies, cache busting, the
    onboarding app, the console's commands, DNS): they act only on options tapfix never sets, yet mitmproxy
    dispatches every hook of every request to every addon in the chain (a context manager, a coroutine and
    two generators apiece, about 500 dispatches per request with the full set), so they cost CPU on every
    request while doing nothing (issue 34)."""
    from mitmproxy.addons import (
        block,
        core,
        disable_h2c,
        errorcheck,
        next_layer,
        proxyauth,
        proxyserver,
        script,
        tlsconfig,
        update_alt_svc,
    )

    master = Master(opts, with_termlog=True)
    master.addons.add(
        core.Core(),
        block.Block(),
        disable_h2c.DisableH2C(),
        proxyauth.ProxyAuth(),
        proxyserver.Proxyserver(),
        script.ScriptLoader(),
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        update_alt_svc.UpdateAltSvc(),
        errorcheck.ErrorCheck(),
    )
    return master


def _not_tapfix(record: logging.LogRecord) -> bool:
    return not (record.name == "tapfix" or record.name.startswith("tapfix."))


async def _wait_listening(master: Master) -> list[Any]:
    proxyserver = master.addons.get("proxyserver")
    for _ in range(500):
        if proxyserver.is_running and not proxyserver.servers.is_updating:
            return list(proxyserver.listen_addrs())
        await asyncio.sleep(0.01)
    return []


# Past asyncio's read buffer (selector_events' `max_size`, 256 KiB, plus malloc's header); below megabyte bodies.
MMAP_THRESHOLD = 512 * 1024


def _return_big_buffers_to_the_os() -> None:
    """Agents send megabyte bodies; glibc's dynamic mmap threshold then moves such buffers into the
    heap of each thread, where they fragment and stay (measured: +20 MB peak RSS at 32 × 1 MB requests).
    A fixed threshold keeps them mmapped and returned on free. No-op off glibc or when the user set it.

    The threshold sits above asyncio's read buffer (every socket read allocates `max_size`, 256 KiB, and
    shrinks it to what arrived): below it, each read of every chunk was an mmap, a page fault, an mremap
    and a munmap (issue 34: +2.6 ms per 256-event request over plain mitmproxy, whose dynamic threshold
    had risen past it). The trim threshold is twice that, as glibc's own dynamic rule sets it: lower, the
    heap's top would grow and shrink (brk) on every read instead."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 2 * MMAP_THRESHOLD)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        pass


def _freeze_what_startup_made() -> None:
    """Once listening: the objects startup made (modules, mitmproxy's and tapfix's) move out of the cyclic
    collector's sight (`gc.freeze`), as they live as long as the process. A full collection then walks only
    what traffic made: measured 0.5 ms instead of 270-330 ms (118,000 objects, a loaded 2-core machine), a
    pause that held every stream's next token, and its CPU every few hundred requests. No collection
    first: startup leaves no cyclic garbage (measured: none), and one would cost ~100 ms before the banner."""
    import gc

    gc.freeze()


def run(settings: Settings, runtime: Runtime, *, ready: Any = None) -> int:
    """Blocking: serve until SIGINT/SIGTERM (in-flight exchanges get the shutdown grace, addons/shutdown.py),
    then drain the capture queue before exiting."""

    def listening() -> None:
        _freeze_what_startup_made()
        if ready is not None:
            ready()

    try:
        asyncio.run(serve(settings, runtime, ready=listening), loop_factory=event_loop.factory())
    except KeyboardInterrupt:
        pass
    except OSError as e:
        print(f"tapfix: {e}", file=sys.stderr)
        return 2
    finally:
        failed = drain(runtime)
        if failed:
            print(f"tapfix: {failed}", file=sys.stderr)
    return 0


def drain(runtime: Runtime) -> str | None:
    """After mitmproxy stopped: the capture writer drains its queue (its thread ends), then the telemetry
    exports flush what the writer's last observers gave them. Returns what failed to be captured, if any."""
    if runtime.writer is None:
        return None
    runtime.writer.close()
    if runtime.fanout is not None:  # after the writer's last observers ran: flush the exports
        runtime.fanout.close()
    health = runtime.writer.health()
    return f"{health['failures']} capture(s) failed: {health['last_error']}" if health["failures"] else None


def prepare(settings: Settings, store: StoreLocator, export: Any = None) -> Runtime:
    """Everything `tapfix run` needs before it listens: upstreams, policy, the capture writer in `store`
    (what `settings.db` names), the OTLP export (`export`, None: off)."""
    from tapfix.addons.runner.setup import StartupError, build_policy
    from tapfix.proxy.store.retention import Retention

    _return_big_buffers_to_the_os()  # before the writer thread exists
    check_exposure(settings)
    try:
        event_loop.choice()  # TAPFIX_EVENT_LOOP: a value it doesn't know is a one-line error before listening
    except ValueError as e:
        raise StartupError(str(e)) from e
    policy, targets = build_policy(settings)
    retention = None
    if settings.max_age_s is not None or settings.max_db_bytes is not None:
        retention = Retention(max_age_s=settings.max_age_s, max_bytes=settings.max_db_bytes)
    elif policy is not None:
        try:
            retention = Retention.from_config(dict(policy.config.retention))
        except ValueError as e:
            raise StartupError(f"{policy.config.source}: retention: {e}") from e
    writer = open_writer(settings, store, retention)
    runtime = build_runtime(settings, policy=policy, targets=targets, writer=writer, export=export)
    if runtime.replay_turns is not None:  # issue 36: turns not in memory are read from the store
        from tapfix.proxy.store.replay_turns import store_lookup

        runtime.replay_turns.lookup = store_lookup(store.backend().reader)
    return runtime


def open_writer(settings: Settings, store: StoreLocator, retention: Any) -> CaptureWriter:
    """The capture writer; an unusable store is a one-line `StoreError`. A PostgreSQL server that is down
    is waited for (traffic flows, exchanges are held), unless `--strict`: then it refuses to start."""
    from tapfix.addons.runner.setup import StartupError
    from tapfix.proxy.store.errors import StoreUnreachable

    options: dict[str, Any] = {"max_held": settings.store_queue, "max_held_bytes": settings.store_queue_bytes}
    try:
        return store.backend().writer(wait=not settings.strict, retention=retention, **options)
    except StoreUnreachable as e:  # a server that is down, which --strict refuses to wait for
        raise StartupError(f"--strict: {e}") from None


def check_exposure(settings: Settings) -> None:
    """Captures hold prompts and code, and the proxy spends the upstream's key: beyond loopback, a token."""
    from tapfix.addons.runner.setup import StartupError

    if settings.token is not None and len(settings.token) < 8:
        raise StartupError("--token / $TAPFIX_TOKEN must be at least 8 characters")
    if not is_loopback(settings.listen_host) and not settings.token:
        raise StartupError(
            f"refusing to listen on {settings.listen_host}:{settings.listen_port} without a token: anyone who can "
            "reach it could use your upstream (and its key) through tapfix. Give --token SECRET (or set "
            "TAPFIX_TOKEN); clients then use SECRET as their API key. Or listen on 127.0.0.1."
        )
