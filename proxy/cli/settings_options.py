"""`tapfix run`'s options, derived from the declarations (config/settings.py), and the config file over them.

Each declared setting with a flag becomes one click option: its kind picks the click type (a range from
the declaration, with the declaration's message), its default and help are the declaration's, a
deprecated spelling stays a hidden alias that warns. `settings_command` hands the command one
`Settings`; `with_config_file` lays the config file's keys under the flags the user typed. The checks that
belong to the layers above config run here too (`_CHECKS`): the store's floors, the registry of
tool-call formats, a link target spans may carry.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from tapfix.proxy.cli.options import Duration, FiniteFloatRange, ListenAddress, Size, deprecated_alias
from tapfix.proxy.cli.user_errors import UserError
from tapfix.proxy.config.declare import Setting
from tapfix.proxy.config.settings import Settings, declared, setting_named
from tapfix.proxy.quantities import finite
from tapfix.proxy.store.held import MIN_HELD_BYTES
from tapfix.proxy.store.locator import StoreLocator
from tapfix.proxy.store.locator_url import NotAStoreLocator


class DeclaredInt(click.IntRange):
    """A whole number in the declared range; out of it, the declaration's message (`Setting.check`)."""

    def __init__(self, setting: Setting) -> None:
        r = setting.range
        low, high = (r.min, r.max) if r is not None else (None, None)
        super().__init__(
            min=None if low is None else int(low),
            max=None if high is None else int(high),
            min_open=r is not None and r.min_open,
        )
        self.setting = setting

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = (
            value if isinstance(value, int) and not isinstance(value, bool) else click.INT.convert(value, param, ctx)
        )
        if not self.setting.accepts(number):
            self.fail(f"must be {self.setting.expectation()}, got {number!r}", param, ctx)
        return number


class DeclaredFloat(FiniteFloatRange):
    """A finite number in the declared range; out of it, the declaration's message (`Setting.check`)."""

    def __init__(self, setting: Setting) -> None:
        r = setting.range
        low, high = (r.min, r.max) if r is not None else (None, None)
        super().__init__(min=low, max=high, min_open=r is not None and r.min_open)
        self.setting = setting

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = float(value) if isinstance(value, int | float) else click.FLOAT.convert(value, param, ctx)
        try:
            finite(number, f"{value!r}")
        except ValueError as e:
            self.fail(str(e), param, ctx)
        if not self.setting.accepts(number):
            self.fail(f"must be {self.setting.expectation()}, got {number!r}", param, ctx)
        return number


def _browse_url(value: str) -> None:
    """`--browse-url`: an http(s) URL with a host, nothing else. Spans carry it as a link a tracing UI
    renders, so `javascript:` or `data:` there would run in whoever clicks it."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value.strip())
        ok = parts.scheme.lower() in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 - raises ValueError for a port that isn't a number
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"{value!r}: give the browser's http:// or https:// URL with a host, e.g. http://127.0.0.1:8081"
        )


def _tool_format(name: str) -> None:
    """An unknown `--tool-format` lists the registered names."""
    from tapfix.proxy.toolcalls.formats import UnknownFormat, armed

    try:
        armed(name)
    except UnknownFormat as e:
        raise ValueError(str(e)) from e


def _max_age(seconds: float) -> None:
    """An age under a minute would purge captures as they arrive."""
    from tapfix.proxy.store.retention import check_max_age

    check_max_age(seconds)


def _max_size(size: int) -> None:
    """A size under the empty store's floor would purge every capture and still be over."""
    from tapfix.proxy.store.retention import check_max_size

    check_max_size(size)


# Checks of a setting's value that belong above config (setting name → check raising ValueError).
_CHECKS: dict[str, Callable[[Any], None]] = {
    "browse_url": _browse_url,
    "tool_format": _tool_format,
    "max_age_s": _max_age,
    "max_db_bytes": _max_size,
}
# The store queue's floor is the store's (proxy/store/held.py): under it the queue holds next to nothing.
_QUEUE_BYTES = Size(MIN_HELD_BYTES, "the store queue must hold at least a few exchanges' bodies")


def click_type(s: Setting) -> Any:
    """The click type that reads the setting's value from the command line (and the config file's)."""
    if s.name == "store_queue_bytes":
        return _QUEUE_BYTES
    match s.kind:
        case "int":
            return DeclaredInt(s)
        case "number":
            return DeclaredFloat(s)
        case "choice":
            return click.Choice(s.choices)
        case "file":
            return click.Path(exists=True, dir_okay=False, path_type=Path)
        case "path":
            return click.Path(exists=True, path_type=Path)
        case "listen":
            return ListenAddress(int(s.default[1]))
        case "age":
            return Duration()
        case "size":
            return Size()
        case "flag":
            return click.BOOL
    return click.STRING


def option(s: Setting) -> click.Option:
    """The click option of one declared setting."""
    assert s.flag is not None
    names = [n for n in (s.short, s.flag) if n]
    shown = s.shown_default()
    common: dict[str, Any] = {"help": s.help, "metavar": s.metavar}
    if s.kind == "flag":
        return click.Option([*names, s.name], is_flag=True, flag_value=not s.default, default=s.default, **common)
    default: Any = s.default
    if s.kind in ("listen", "size"):
        default = shown  # the type reads it as a user would write it
    elif s.kind == "hosts":
        default = None
    return click.Option(
        [*names, s.name],
        type=click_type(s),
        default=default,
        show_default=s.default_text if s.default_text is not None else shown is not None,
        multiple=s.kind == "hosts",
        envvar=s.envvar,
        show_envvar=s.envvar is not None,
        **common,
    )


def settings_command(f: Callable[[Settings], Any]) -> Callable[..., Any]:
    """Give `f` (a click command's function) every declared option, and one `Settings` built from them."""

    @functools.wraps(f)
    def command(**values: Any) -> Any:
        return f(settings_from(values))

    wrapped: Callable[..., Any] = command
    for s in declared():
        for old in s.old_flags:
            assert s.flag is not None
            wrapped = deprecated_alias(old, s.flag, s.name, type=click_type(s))(wrapped)
    params = [option(s) for s in declared() if s.flag]
    wrapped.__click_params__ = [*getattr(wrapped, "__click_params__", []), *reversed(params)]  # type: ignore[attr-defined]
    return wrapped


def _check_store(value: str | None, s: Setting) -> None:
    """A store named like a URL of another scheme is refused at once, `$TAPFIX_DB`'s too (the default)."""
    try:
        StoreLocator.resolve(value, postgres=True)
    except NotAStoreLocator as e:
        raise click.BadParameter(str(e), param_hint=f"'{s.flag}'") from None


def settings_from(values: dict[str, Any]) -> Settings:
    """`Settings` from the converted option values; the checks above config (`_CHECKS`) run here, after
    a deprecated spelling's value joined its option's."""
    for name, check in _CHECKS.items():
        if values.get(name) is not None:
            try:
                check(values[name])
            except ValueError as e:
                flag = setting_named(name).flag
                raise click.BadParameter(str(e).removeprefix(f"{flag} "), param_hint=f"'{flag}'") from e
    values = {s.name: values[s.name] for s in declared() if s.flag and s.name in values}
    for s in declared():
        if s.kind == "store":
            _check_store(values.get(s.name), s)
        if s.kind == "secret" and not values.get(s.name):
            values[s.name] = None  # `TAPFIX_TOKEN=` set empty: no token
        if s.kind == "hosts" and s.name in values:
            values[s.name] = tuple(values[s.name] or ())
    return Settings(**values)


def with_config_file(settings: Settings) -> Settings:
    """`settings` with the config file's run settings under them: a key the file sets wins over a default
    (or `$TAPFIX_DB`), a flag the user typed wins over the file. Each file value is read by its flag's
    own type, so it is checked exactly as the flag would be."""
    from tapfix.proxy.config.file import Config, ConfigError

    assert settings.config_path is not None
    try:
        config = Config.load(settings.config_path)
    except ConfigError as e:
        raise UserError(str(e)) from e
    ctx = click.get_current_context()
    params = {p.name: p for p in ctx.command.params}
    changed: dict[str, Any] = {}
    for s in declared():
        if (
            s.name not in config.run_settings
            or ctx.get_parameter_source(s.name) is click.core.ParameterSource.COMMANDLINE
        ):
            continue
        param = params[s.name]
        try:
            changed[s.name] = param.type.convert(config.run_settings[s.name], param, ctx)
        except click.BadParameter as e:
            raise UserError(f"{settings.config_path}: {s.key}: {e.message}") from e
    return dataclasses.replace(settings, **changed)
