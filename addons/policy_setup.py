"""Build the request policy and upstream targets from flags (quick mode) or a config file."""

from __future__ import annotations

import logging
from typing import Any

from tapfix.proxy.settings import Settings
from tapfix.proxy.upstream import UpstreamTarget

log = logging.getLogger("tapfix")


def build_policy(settings: Settings) -> tuple[Any, dict[str, UpstreamTarget]]:
    return None, {}
