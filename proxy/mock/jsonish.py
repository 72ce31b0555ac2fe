"""Narrowing helpers for JSON from clients: a wrong type reads as empty, never raises."""

from __future__ import annotations

from typing import Any


def obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def arr(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
