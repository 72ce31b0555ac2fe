"""The PostgreSQL backend of the capture store: locators (`postgresql://...`) and the migration set.

Pure: nothing here imports mitmproxy, and psycopg (the extra `tapfix[postgres]`) is imported only where
a PostgreSQL store is really used, so a SQLite-only install never needs it.
"""
