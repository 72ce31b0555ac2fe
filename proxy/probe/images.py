"""Test images made in code: a probe must not download anything, and must know the right answer.

A PNG is a signature and three chunks (IHDR, IDAT, IEND), each `length | type | data | crc32`;
IDAT is the zlib stream of the scanlines, each prefixed by filter byte 0 (none). That is all a
solid colour needs, in pure Python with zlib and struct.
"""

from __future__ import annotations

import base64
import struct
import zlib

# Colour names a vision model may use for each probe colour (matched as whole words).
COLOURS: dict[str, tuple[tuple[int, int, int], tuple[str, ...]]] = {
    "red": ((220, 20, 20), ("red", "crimson", "scarlet")),
    "green": ((20, 180, 40), ("green",)),
    "blue": ((20, 40, 220), ("blue",)),
    "yellow": ((240, 220, 20), ("yellow",)),
}


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def solid_png(rgb: tuple[int, int, int], width: int = 64, height: int = 64) -> bytes:
    """An 8-bit RGB PNG of one colour. 64x64 is above every vision encoder's minimum patch size."""
    if width <= 0 or height <= 0:
        raise ValueError("width and height must be positive")
    row = b"\x00" + bytes(rgb) * width
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # depth 8, colour type 2 (RGB)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(row * height, 9))
        + _chunk(b"IEND", b"")
    )


def data_url(png: bytes) -> str:
    """The `data:` URL an OpenAI-style `image_url` part carries (no upload, no file server)."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def colour_png(name: str) -> str:
    """A data URL of the named probe colour."""
    return data_url(solid_png(COLOURS[name][0]))
