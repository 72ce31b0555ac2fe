"""Config files for tests, written table by table as a user writes them in tapfix.toml."""

from __future__ import annotations

import json


def toml_table(name: str, **keys: str | int) -> str:
    """One TOML table: `toml_table("models.qwen", upstream="gpu0", context_window=1024)` is

    [models.qwen]
    upstream = "gpu0"
    context_window = 1024

    A string value is a TOML basic string (the same escapes as JSON), so any URL or name reads back unchanged.
    """
    return f"[{name}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in keys.items()) + "\n"
