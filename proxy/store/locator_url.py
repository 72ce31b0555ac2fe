"""Which `--db` values are URLs (`tapfix.proxy.vocabulary.store_url` judges the text), as the store's
own error.

A typo such as `postgressql://user:pw@host/db` must never become a SQLite file named after the URL:
`refuse_url_like` raises `NotAStoreLocator`, a `StoreError` every command reports in one line.
"""

from __future__ import annotations

from tapfix.proxy.store.errors import StoreError
from tapfix.proxy.vocabulary.store_url import url_like_problem


class NotAStoreLocator(StoreError):
    """A value that looks like a URL but names no store tapfix can use: a usage error where it is given."""


def refuse_url_like(value: str) -> None:
    """`NotAStoreLocator` (the scheme named, the password masked) when `value` looks like a URL other than
    a PostgreSQL store's; nothing for a PostgreSQL URL or a file path."""
    problem = url_like_problem(value)
    if problem is not None:
        raise NotAStoreLocator(problem)
