"""The PostgreSQL backend of the capture store: one database (or schema) that a fleet of tapfix instances
writes at once, day-partitioned.

`PostgresStore` (store.py) is the `StoreBackend` (store/backend.py); the rest are its parts: locators
(`postgresql://...`), the migration set and its application, the writer's seam and bodies, the reader,
tail, retention and copy, and the browser's queries.

Pure: nothing here imports mitmproxy, and psycopg (the extra `tapfix[postgres]`) is imported only where
a PostgreSQL store is really used, so a SQLite-only install never needs it.
"""
