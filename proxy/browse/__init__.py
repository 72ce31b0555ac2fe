"""The capture browser behind `tapfix browse`: read-only HTML pages over the capture store."""

from tapfix.proxy.browse.app import create_app

__all__ = ["create_app"]
