"""The capture store: writer, reader, schema and migrations, bodies, sessions, retention, redaction."""
