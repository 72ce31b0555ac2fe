"""What the store raises, on every backend: a command shows each as one line, never a traceback.

A backend turns its database's own errors (sqlite3's, psycopg's) into these where a command meets
them, so no command outside store/ needs to know which database it talks to.
"""

from __future__ import annotations


class StoreError(Exception):
    """A store that can't be opened or used, or isn't a tapfix capture store."""


class StoreUnreachable(StoreError):
    """A database server that can't be reached now: a writer that may wait for it holds what comes instead."""


class CaptureNotFound(StoreError):
    """No capture with that id (or prefix), or more than one."""
