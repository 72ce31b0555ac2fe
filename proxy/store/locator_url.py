"""Which `--db` values are URLs: a PostgreSQL store's, or a mistake that must never become a SQLite file.

A SQLite store is a file path; `postgresql://` or `postgres://` names a PostgreSQL store. Anything else
that looks like a URL is refused, naming its scheme: a typo such as `postgressql://user:pw@host/db`
would otherwise become a SQLite file named after the URL (the password in a folder name) while the
captures never reach the shared database, and the host would look healthy.

Looks like a URL: a scheme of two characters or more (`C:` is a drive) followed by `:/`, `://`
anywhere, or a PostgreSQL scheme without its `//` (`postgresql:/db`, `postgresql:db`). A file name
with a colon (`tapfix:2026.db`, `/tmp/a:b.db`) is still a file.
"""

from __future__ import annotations

import difflib
import re

from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.store.pg.locator import is_postgres_url, mask_password

POSTGRES_SCHEMES = ("postgresql", "postgres")
_SCHEME = re.compile(r"\s*([A-Za-z][A-Za-z0-9+.-]+):")


class NotAStoreLocator(StoreError):
    """A value that looks like a URL but names no store tapfix can use: a usage error where it is given."""


def refuse_url_like(value: str) -> None:
    """`NotAStoreLocator` (the scheme named, the password masked) when `value` looks like a URL other than
    a PostgreSQL store's; nothing for a PostgreSQL URL or a file path."""
    if is_postgres_url(value):
        return
    m = _SCHEME.match(value)
    scheme = m.group(1) if m else None
    shown = mask_password(value.strip())
    if scheme is not None and scheme.lower() in POSTGRES_SCHEMES:
        raise NotAStoreLocator(
            f"{shown}: a malformed PostgreSQL URL; it starts {scheme.lower()}:// (two slashes), e.g. "
            f"{scheme.lower()}://user@host/db"
        )
    if m is not None and value[m.end() :].startswith("/"):
        name = scheme
    elif "://" in value:
        name = value.partition("://")[0].strip().rsplit("/", 1)[-1]
    else:
        return
    close = difflib.get_close_matches((name or "").lower(), POSTGRES_SCHEMES, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}://?)" if close else ""
    raise NotAStoreLocator(
        f"{shown}: unknown store URL scheme {name!r}{hint}; the capture store is a SQLite file path or a "
        "postgresql:// URL"
    )
