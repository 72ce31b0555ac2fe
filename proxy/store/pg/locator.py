"""PostgreSQL locators: `postgresql://user:password@host:port/db?...` (or `postgres://`), as `--db` or `$TAPFIX_DB`.

The URL is libpq's own, handed to psycopg as it is, so `PGPASSWORD`, `~/.pgpass`, `PGSERVICE`
(`postgresql:///?service=NAME`) and every libpq parameter work without tapfix knowing them.

A password in the URL is never shown: the banner, health, logs and errors show `mask_password(url)`
(`tapfix.proxy.vocabulary.store_url`, with `is_postgres_url`: text only, so the config file judges `db`
alike),
`user:***@`, and a `password=` query parameter as `password=***`. Masking is deliberately greedy: the
user info runs to the last `@` (before a `#`), so a password with an unescaped `@`, `:`, `/` or `?`
is hidden whole wherever libpq would cut it; the price is that an `@` later in the URL (in a query
value) hides a little more than the password. `PostgresLocator.scrub` removes the password from any
other text (an error message that quotes the URL).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from urllib.parse import unquote

from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.vocabulary.store_url import ANY_SCHEME, MASK, mask_password
from tapfix.proxy.vocabulary.store_url import POSTGRES_URL as _SCHEME
from tapfix.proxy.vocabulary.store_url import is_postgres_url as is_postgres_url

EXTRA = "tapfix[postgres]"


def _passwords(url: str) -> list[str]:
    """Every spelling of the URL's passwords (as written and percent-decoded), longest first."""
    m = ANY_SCHEME.match(url)
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
