"""The SQLite backend of the capture store: one file, WAL mode, one writer beside any number of readers.

`SqliteStore` (store.py) is the `StoreBackend` (store/backend.py); the rest are its parts: opening and
the migrations (database.py, schema.py), the writer's seam (writer.py) and bodies (bodies.py), the
reader, tail, retention and copy, and the browser's queries and search index.
"""
