"""Config files for tests, written table by table as a user writes them in tapfix.toml."""

from __future__ import annotations

import json


def toml_table(name: str, **keys: str | float | list[str]) -> str:
    """One TOML table: `toml_table("models.qwen", upstream="gpu0", context_window=1024)` is

    [models.qwen]
    upstream = "gpu0"
    context_window = 1024

    A value is written as JSON, which for strings (a TOML basic string has JSON's escapes), numbers and lists of
    strings is TOML too, so any URL or name reads back unchanged.
    """
    return f"[{name}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in keys.items()) + "\n"
