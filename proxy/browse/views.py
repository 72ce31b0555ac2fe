"""Rendering: one autoescaping Jinja2 environment over the string templates, and its filters."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import orjson
from jinja2 import DictLoader, Environment, select_autoescape
from markupsafe import Markup, escape
from starlette.responses import HTMLResponse
from tapfix.proxy.browse.templates import ALL


def ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f} s" if value >= 10_000 else f"{value:.0f} ms"


def when(value: str | None) -> str:
    """ISO 8601 UTC → `2025-01-31 10:00:01` (the page says UTC once, in the column header)."""
    if not value:
        return "-"
    return value.replace("T", " ")[:19]


def client(user_agent: str | None) -> str:
    return (user_agent or "-").split(" ")[0][:60]


def marked(snippet: str | None) -> Markup:
    """An FTS5 snippet with \\x02/\\x03 around matches: escape everything, then mark the matches."""
    return Markup(str(escape(snippet or "")).replace("\x02", "<mark>").replace("\x03", "</mark>"))


def pretty_args(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            return orjson.dumps(orjson.loads(arguments), option=orjson.OPT_INDENT_2).decode()
        except orjson.JSONDecodeError:
            return arguments
    return orjson.dumps(arguments, option=orjson.OPT_INDENT_2).decode()


def tojson_pretty(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def count(value: Any) -> str:
    """A count with thousands separators; `-` for none."""
    return "-" if value is None else f"{value:,}"


def pathseg(value: Any) -> str:
    return quote(str(value), safe="")


def _environment() -> Environment:
    env = Environment(
        loader=DictLoader(ALL),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=False,
    )
    env.filters.update(
        ms=ms,
        count=count,
        when=when,
        client=client,
        marked=marked,
        pretty_args=pretty_args,
        tojson_pretty=tojson_pretty,
        urlencode=pathseg,
    )
    return env


ENV = _environment()


def render(name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(ENV.get_template(name).render(**context), status_code=status_code)
