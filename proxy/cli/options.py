"""Options several commands share, defined once so they are spelled, checked and documented alike.

Values arrive converted: `--db` as a `StoreLocator`, `--listen` as (host, port), `--max-age` as
seconds, `--max-size` as bytes. A value that can't be converted is a usage error (exit 2) that
names it, raised by click before the command starts anything. Old spellings stay as hidden aliases
that warn on stderr (`deprecated_alias`); CHANGELOG.md lists them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click
from tapfix.proxy.config.model import QUICK_ENGINES
from tapfix.proxy.net import parse_listen
from tapfix.proxy.quantities import finite, human_bytes, parse_duration, parse_size
from tapfix.proxy.store.locator import StoreLocator
from tapfix.proxy.store.locator_url import NotAStoreLocator

F = TypeVar("F", bound=Callable[..., Any])

DB_HELP = "capture database (default: $TAPFIX_DB or captures/tapfix.db)"


class ListenAddress(click.ParamType):  # type: ignore[type-arg, unused-ignore]  # generic from click 8.5 on
    """`HOST:PORT`, `:PORT`, `PORT` or `[v6]:PORT` → (host, port), see `tapfix.proxy.net.parse_listen`."""

    name = "HOST:PORT"

    def __init__(self, default_port: int) -> None:
        self.default_port = default_port

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, int]:
        if isinstance(value, tuple):
            return value
        try:
            return parse_listen(str(value), self.default_port)
        except ValueError as e:
            self.fail(str(e), param, ctx)


class Duration(click.ParamType):  # type: ignore[type-arg, unused-ignore]  # generic from click 8.5 on
    """`7d`, `12h`, `30m`, `90s`, `1y`, `1h30m` or plain seconds → seconds (`tapfix.proxy.quantities`)."""

    name = "AGE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return parse_duration(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


class Size(click.ParamType):  # type: ignore[type-arg, unused-ignore]  # generic from click 8.5 on
    """`256MiB`, `500M`, `2G`, `100k`, `10B` → bytes (`tapfix.proxy.quantities`); `minimum`: the least the
    option can work with, refused below it (the message names it and `why`)."""

    name = "SIZE"

    def __init__(self, minimum: int = 0, why: str = "") -> None:
        self.minimum, self.why = minimum, why

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            size = parse_size(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)
        if size < self.minimum:
            self.fail(
                f"{str(value).strip()!r} ({human_bytes(size)}) is below the minimum, {human_bytes(self.minimum)}: "
                f"{self.why}",
                param,
                ctx,
            )
        return size


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange, with NaN and ±infinity refused first: they pass every comparison a range makes.
    Every float option with a range uses it (`tapfix.proxy.quantities.finite`)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            number = float(value)
        except (TypeError, ValueError):
            return super().convert(value, param, ctx)  # not a number at all: click's own message
        try:
            finite(number, f"{value!r}")
        except ValueError as e:
            self.fail(str(e), param, ctx)
        return super().convert(value, param, ctx)


def db_option(help: str = DB_HELP, *, file_only: bool = False) -> Callable[[F], F]:
    """`--db PATH`, given to the command as a `StoreLocator` (from --db, $TAPFIX_DB or the default): any
    store, or (`file_only`: `demo`, which keeps a SQLite file of its own) a file only (store/locator.py)."""

    def locate(ctx: click.Context, param: click.Parameter, value: str | None) -> StoreLocator:
        try:
            return StoreLocator.resolve(value, postgres=not file_only)
        except NotAStoreLocator as e:  # a URL-like value with a wrong scheme is a usage error (exit 2)
            raise click.BadParameter(str(e), ctx, param) from None

    return click.option("--db", "db", metavar="PATH", default=None, callback=locate, help=help)


def listen_option(default: str, help: str | None = None, *names: str) -> Callable[[F], F]:
    host_port = default.rpartition(":")
    return click.option(
        *(names or ("--listen", "listen")),
        type=ListenAddress(int(host_port[2])),
        default=default,
        show_default=True,
        help=help or f"{ListenAddress.name}, :PORT, PORT or [IPv6]:PORT",
    )


def engine_option(help: str) -> Callable[[F], F]:
    return click.option("--engine", type=click.Choice(QUICK_ENGINES), help=help)


def key_env_option(help: str) -> Callable[[F], F]:
    return click.option("--key-env", "key_env", metavar="NAME", help=help)


def json_option(help: str) -> Callable[[F], F]:
    return click.option("--json", "as_json", is_flag=True, help=help)


def timeout_option(default: float, help: str) -> Callable[[F], F]:
    """`--timeout SECONDS`, above 0."""
    return click.option(
        "--timeout", type=FiniteFloatRange(min=0, min_open=True), default=default, show_default=True, help=help
    )


def max_age_option(help: str) -> Callable[[F], F]:
    return click.option("--max-age", "max_age", type=Duration(), default=None, help=help)


def max_size_option(help: str) -> Callable[[F], F]:
    return click.option("--max-size", "max_size", type=Size(), default=None, help=help)


def deprecated_alias(old: str, new: str, dest: str, type: Any = None) -> Callable[[F], F]:
    """A hidden `old` spelling of option `new`: it still works, with a one-line warning on stderr.

    The value lands in `dest` (the new option's parameter) when the new spelling isn't given too.
    Kept apart from the new option (not one click parameter with two names) so the warning names
    exactly what the user typed and the help shows only the new spelling.
    """
    hidden = f"deprecated_{dest}"

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def command(*args: Any, **kw: Any) -> Any:
            value = kw.pop(hidden, None)
            if value is not None:
                if kw.get(dest) is not None:
                    raise click.UsageError(f"{old} is the old spelling of {new}: give only {new}")
                click.echo(f"tapfix: {old} is deprecated, use {new} (same meaning)", err=True)
                kw[dest] = value
            return f(*args, **kw)

        option = click.option(old, hidden, type=type, default=None, hidden=True)
        return option(command)  # type: ignore[return-value]  # functools.wraps keeps f's signature and params

    return decorate
