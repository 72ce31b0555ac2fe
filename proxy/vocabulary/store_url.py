"""Which `--db` values are URLs: a PostgreSQL store's, or a mistake that must never become a SQLite file.

A SQLite store is a file path; `postgresql://` or `postgres://` names a PostgreSQL store. Anything else
that looks like a URL is refused, naming its scheme: a typo such as `postgressql://user:pw@host/db`
would otherwise become a SQLite file named after the URL (the password in a folder name) while the
captures never reach the shared database, and the host would look healthy.

Looks like a URL: a scheme of two characters or more (`C:` is a drive) followed by `:/`, `://`
anywhere, or a PostgreSQL scheme without its `//` (`postgresql:/db`, `postgresql:db`). A file name
with a colon (`tapfix:2026.db`, `/tmp/a:b.db`) is still a file.

Text only, below every package: the config file's `db` is judged here as the command line's `--db` is
(`store/locator_url.py` raises the store's error with these words). A password in a URL is never shown:
`mask_password` is what every message quotes.
"""

from __future__ import annotations

import difflib
import re

POSTGRES_SCHEMES = ("postgresql", "postgres")
POSTGRES_URL = re.compile(r"(postgres(?:ql)?)://", re.IGNORECASE)
MASK = "***"
ANY_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/*")  # masking covers any URL: a refused typo is shown too
_QUERY_PASSWORD = re.compile(r"(^|&)(password=)[^&#]*", re.IGNORECASE)
_SCHEME = re.compile(r"\s*([A-Za-z][A-Za-z0-9+.-]+):")


def is_postgres_url(value: str) -> bool:
    """`postgresql://` or `postgres://`, in any case: the two prefixes libpq accepts."""
    return POSTGRES_URL.match(value.strip()) is not None


def mask_password(url: str) -> str:
    """The URL with its password shown as `***` (user info and `password=`); anything else unchanged.
    Any scheme: a URL tapfix refuses (`postgressql://…`) is shown masked in the refusal.

    Masking is deliberately greedy: the user info runs to the last `@` (before a `#`), so a password
    with an unescaped `@`, `:`, `/` or `?` is hidden whole wherever libpq would cut it."""
    m = ANY_SCHEME.match(url)
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


def url_like_problem(value: str) -> str | None:
    """Why `value` names no store (the scheme named, the password masked) when it looks like a URL other
    than a PostgreSQL store's; None for a PostgreSQL URL or a file path."""
    if is_postgres_url(value):
        return None
    m = _SCHEME.match(value)
    scheme = m.group(1) if m else None
    shown = mask_password(value.strip())
    if scheme is not None and scheme.lower() in POSTGRES_SCHEMES:
        return (
            f"{shown}: a malformed PostgreSQL URL; it starts {scheme.lower()}:// (two slashes), e.g. "
            f"{scheme.lower()}://user@host/db"
        )
    if m is not None and value[m.end() :].startswith("/"):
        name = scheme
    elif "://" in value:
        name = value.partition("://")[0].strip().rsplit("/", 1)[-1]
    else:
        return None
    close = difflib.get_close_matches((name or "").lower(), POSTGRES_SCHEMES, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}://?)" if close else ""
    return (
        f"{shown}: unknown store URL scheme {name!r}{hint}; the capture store is a SQLite file path or a "
        "postgresql:// URL"
    )
