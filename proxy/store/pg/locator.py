"""PostgreSQL locators: `postgresql://user:password@host:port/db?...` (or `postgres://`), as `--db` or `$TAPFIX_DB`.

The URL is libpq's own, handed to psycopg as it is, so `PGPASSWORD`, `~/.pgpass`, `PGSERVICE`
(`postgresql:///?service=NAME`) and every libpq parameter work without tapfix knowing them.

A password in the URL is never shown: the banner, health, logs and errors show `mask_password(url)`,
`user:***@`, and a `password=` query parameter as `password=***`. Masking is deliberately greedy: the
user info runs to the last `@` (before a `#`), so a password with an unescaped `@`, `:`, `/` or `?`
is hidden whole wherever libpq would cut it; the price is that an `@` later in the URL (in a query
value) hides a little more than the password. `PostgresLocator.scrub` removes the password from any
other text (an error message that quotes the URL).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import ModuleType
from urllib.parse import unquote

from tapfix.proxy.store.errors import StoreError

EXTRA = "tapfix[postgres]"
_SCHEME = re.compile(r"(postgres(?:ql)?)://", re.IGNORECASE)
_ANY_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/*")  # masking covers any URL: a refused typo is shown too
_QUERY_PASSWORD = re.compile(r"(^|&)(password=)[^&#]*", re.IGNORECASE)
MASK = "***"


def is_postgres_url(value: str) -> bool:
    """`postgresql://` or `postgres://`, in any case: the two prefixes libpq accepts."""
    return _SCHEME.match(value.strip()) is not None


def mask_password(url: str) -> str:
    """The URL with its password shown as `***` (user info and `password=`); anything else unchanged.
    Any scheme: a URL tapfix refuses (`postgressql://…`) is shown masked in the refusal."""
    m = _ANY_SCHEME.match(url)
    if m is None:
        return url
    rest = url[m.end() :]
    at = rest.rfind("@")  # greedy: a raw `@`, `#`, `/` or `?` in the password stays inside what is masked
    info, tail = (rest[: at + 1], rest[at + 1 :]) if at >= 0 else ("", rest)
    user, colon, _ = info[:-1].partition(":")
    if colon:
        info = f"{user}:{MASK}@"
    tail, hash_, fragment = tail.partition("#")
    host, qmark, query = tail.partition("?")
    if qmark:
        query = _QUERY_PASSWORD.sub(rf"\1\2{MASK}", query)
    return url[: m.end()] + info + host + qmark + query + hash_ + fragment


def _passwords(url: str) -> list[str]:
    """Every spelling of the URL's passwords (as written and percent-decoded), longest first."""
    m = _ANY_SCHEME.match(url)
    if m is None:
        return []
    rest = url[m.end() :]
    found = []
    at = rest.rfind("@")
    if at >= 0 and ":" in rest[:at]:
        found.append(rest[:at].partition(":")[2])
    query = rest[at + 1 :].partition("#")[0].partition("?")[2]
    for part in query.split("&"):
        key, eq, value = part.partition("=")
        if eq and key.lower() == "password":
            found.append(value)
    spelled = {s for p in found for s in (p, unquote(p)) if s}
    return sorted(spelled, key=len, reverse=True)


@dataclass(frozen=True)
class PostgresLocator:
    """A PostgreSQL store's URL. `str()` and `repr()` show it masked: printing a locator is always safe."""

    url: str = field(repr=False)

    @classmethod
    def parse(cls, value: str) -> PostgresLocator:
        """Check the URL with libpq's own parser (via psycopg); `StoreError` (password masked) when
        psycopg is missing or the URL is malformed."""
        value = value.strip()
        m = _SCHEME.match(value)
        if m is None:
            raise StoreError(f"{mask_password(value)}: not a postgresql:// URL")
        url = m.group(1).lower() + value[len(m.group(1)) :]  # libpq wants the scheme in lower case
        locator = cls(url)
        conninfo = require_psycopg(locator)
        try:
            conninfo.conninfo_to_dict(url)
        except Exception as e:  # psycopg.ProgrammingError: libpq's message for a malformed URL
            raise StoreError(f"{locator}: not a usable PostgreSQL URL ({locator.scrub(str(e).strip())})") from None
        return locator

    def __str__(self) -> str:
        return mask_password(self.url)

    def __repr__(self) -> str:
        return f"PostgresLocator({mask_password(self.url)!r})"

    def scrub(self, text: str) -> str:
        """`text` with the URL masked and every spelling of its password replaced by `***`."""
        text = text.replace(self.url, mask_password(self.url))
        for password in _passwords(self.url):
            text = text.replace(password, MASK)
        return text


def require_psycopg(locator: PostgresLocator) -> ModuleType:
    """psycopg's `conninfo` module, or a one-line `StoreError` naming the extra to install."""
    try:
        import psycopg_pool  # noqa: F401  (the writer and readers pool their connections)
        from psycopg import conninfo
    except ImportError as e:
        raise StoreError(
            f"{locator}: a PostgreSQL store needs the extra {EXTRA} (pip install '{EXTRA}'); "
            f"{e.name or 'psycopg'} is not installed"
        ) from None
    return conninfo
