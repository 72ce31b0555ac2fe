"""The quantities users type, read one way wherever they are typed: byte sizes, durations, and the
floats that have a range. Every size option (`--max-size`, `--store-queue-bytes`, the config's
`[retention] max_size`) and every age option (`--max-age`, `captures tail --since`, `[retention]`) reads
through here, so `2G`, `1h30m` and `7d` mean the same everywhere and a mistake gets the same message.

- **Sizes** take a unit: `256MiB`, `256MB`, `256M`, `1.5G`, `100k`, `10B`. Units are binary (k = KiB =
  1024 bytes, M = MiB, G = GiB, T = TiB), with or without `i` and `B`: what tapfix always read. A bare
  number is bytes, but only from 1 MiB up: `--store-queue-bytes 10` surely meant 10 MiB or GiB, not ten
  bytes, and taking it as bytes lost captures; below 1 MiB the unit must be written.
- **Durations**: a number with a unit, `90s`, `30m`, `12h`, `7d`, `2w`, `1y` (365 days), or several that
  add up, `1h30m`, `1d12h`; a bare number is seconds. A negative one is refused with its own message
  (an age already counts back from now).
- **Floats with a range**: NaN and ±infinity pass every comparison a range makes (`nan < 0` is false), so
  `finite` refuses them first; the command line's float options and the config check through it.
"""

from __future__ import annotations

import math
import re

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|(b|bytes?))?", re.I)
_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}
BARE_SIZE_FLOOR = 1024**2  # a bare number below this is a missing unit, not a size in bytes
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([ywdhms])", re.I)
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?\s*[ywdhms]\s*)+", re.I)
_SECONDS = re.compile(r"\d+(?:\.\d+)?")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 365 * 86400}
DURATION_EXAMPLES = "90s, 30m, 12h, 7d, 1y or 1h30m"


def parse_size(text: str) -> int:
    """`256MiB`, `1GB`, `500M`, `100k`, `10B`, or a bare number of bytes from 1 MiB up → bytes."""
    value = text.strip()
    if value.startswith("-"):
        raise ValueError(f"{value!r}: a size can't be negative")
    m = _SIZE.fullmatch(value)
    if not m:
        raise ValueError(f"{text!r} is not a size: expected a number and a unit, e.g. 256MiB, 500M, 2G")
    number, unit, in_bytes = m.groups()
    size = int(float(number) * _SIZE_UNITS[(unit or "").lower()])
    if unit is None and in_bytes is None and size < BARE_SIZE_FLOOR:
        raise ValueError(
            f"{value!r} has no unit, and as bytes it is below {human_bytes(BARE_SIZE_FLOOR)}: write its unit, "
            f"e.g. {number}M or {number}G ({number}B if bytes are meant)"
        )
    return size


def parse_duration(text: str) -> float:
    """`90s`, `30m`, `12h`, `7d`, `2w`, `1y`, `1h30m` (parts add up), or a bare number of seconds → seconds."""
    value = text.strip()
    if value.startswith("-") and (_DURATION.fullmatch(value[1:].strip()) or _SECONDS.fullmatch(value[1:].strip())):
        raise ValueError(f"{value!r}: a duration can't be negative (an age counts back from now: {value[1:].strip()})")
    if _SECONDS.fullmatch(value):
        return float(value)
    if not _DURATION.fullmatch(value):
        raise ValueError(f"{text!r} is not a duration: expected a number and a unit, e.g. {DURATION_EXAMPLES}")
    return sum(float(n) * _DURATION_UNITS[u.lower()] for n, u in _DURATION_PART.findall(value))


def is_duration(text: str) -> bool:
    """`text` is written as a duration with its unit (or a negative one, which `parse_duration` refuses):
    what `captures tail --since` reads as an age rather than a capture id."""
    value = text.strip().removeprefix("-").strip()
    return bool(_DURATION.fullmatch(value)) or (text.strip().startswith("-") and bool(_SECONDS.fullmatch(value)))


def finite(value: float, name: str) -> float:
    """`value`, refusing NaN and ±infinity (ValueError naming `name`): check it before any range."""
    if not math.isfinite(value):
        raise ValueError(f"{name}: found {value!r}, expected a finite number (not NaN or infinity)")
    return value


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"
