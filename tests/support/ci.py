"""A real component the suite needs but this machine lacks: a skip on a developer's machine, a
failure under CI (`.ci/run` installs every component, so CI never skips what it should run)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(reason: str) -> NoReturn:
    if in_ci():
        pytest.fail(f"{reason} (CI never skips this)", pytrace=False)
    pytest.skip(f"{reason} (set CI=1 to make this a failure)")
