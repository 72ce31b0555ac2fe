"""The CLI tests' small capture store (tests/support/capture_store.py)."""

from tests.support.capture_store import store  # noqa: F401
