"""sqlite-utils as tapfix uses it: imported without numpy and pandas, and the name of tapfix's migrations.

sqlite-utils imports numpy and pandas when they are installed, only to map their scalar types to column
types for rows built from them (`sqlite_utils.db.COLUMN_TYPE_MAPPING`). tapfix writes rows of plain
Python values, so those mappings are never used, yet importing numpy cost every process that opens a
store ~0.15-0.3 s of CPU and ~20 MB of memory (bench/startup.py). While sqlite-utils is first imported,
both names are marked unimportable for that one import (`sys.modules[name] = None` makes `import name`
raise ImportError, which sqlite-utils handles by leaving them out); a package the process already
imported is left alone, and the marks are removed afterwards, so anything else can still import them.
"""

from __future__ import annotations

import sys
import threading

# The store's record in sqlite-utils' `_sqlite_migrations` table (schema.py's `Migrations`), read by
# readers that never import sqlite-utils (store/sqlite/database.py checks whose store it is).
MIGRATION_SET = "tapfix"
_SKIPPED = ("numpy", "pandas")
_lock = threading.Lock()


def import_sqlite_utils() -> None:
    """Import sqlite-utils (once per process) without numpy and pandas; later calls return at once."""
    if "sqlite_utils.db" in sys.modules:
        return
    with _lock:
        if "sqlite_utils.db" in sys.modules:
            return
        marked = [name for name in _SKIPPED if name not in sys.modules]
        for name in marked:
            sys.modules[name] = None  # type: ignore[assignment]
        try:
            import sqlite_utils.db  # noqa: F401
        finally:
            for name in marked:
                if sys.modules.get(name, 0) is None:
                    del sys.modules[name]
