"""Replays and repros: client replay and its summary, server-side replay, exports and bug-report bundles."""
