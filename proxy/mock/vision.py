"""Just enough PNG decoding (zlib + scanline filters, no Pillow) to name an image's dominant colour.

The deep probe checks that a vision model really sees the image it is sent; the mock is the healthy
reference, so it must answer from the pixels, and say nothing when it cannot decode them.
"""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from collections import Counter

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_MAX_PIXELS = 16_000_000

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 20, 20),
    "green": (30, 160, 40),
    "blue": (30, 60, 220),
    "yellow": (240, 220, 30),
    "orange": (245, 140, 20),
    "purple": (130, 40, 160),
    "pink": (245, 150, 190),
    "cyan": (30, 210, 220),
    "magenta": (220, 30, 200),
    "brown": (120, 70, 30),
    "white": (250, 250, 250),
    "black": (5, 5, 5),
    "gray": (128, 128, 128),
}


class PNGError(ValueError):
    pass


def decode_data_url(url: str) -> bytes | None:
    """The bytes of a `data:image/png;base64,…` URL, or None for anything else."""
    if not url.startswith("data:image/png;base64,"):
        return None
    try:
        return base64.b64decode(url.split(",", 1)[1], validate=False)
    except (binascii.Error, ValueError):
        return None


def decode_png(data: bytes) -> tuple[int, int, list[tuple[int, int, int, int]]]:
    """(width, height, RGBA pixels row by row) of a non-interlaced PNG."""
    if not data.startswith(_SIGNATURE):
        raise PNGError("not a PNG")
    pos = len(_SIGNATURE)
    header: tuple[int, int, int, int, int] | None = None
    palette: list[tuple[int, int, int]] = []
    alphas: bytes = b""
    idat = bytearray()
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _comp, _filt, interlace = struct.unpack(">IIBBBBB", body)
            if interlace:
                raise PNGError("interlaced PNG not supported")
            header = (width, height, depth, colour, interlace)
        elif kind == b"PLTE":
            palette = [(body[i], body[i + 1], body[i + 2]) for i in range(0, len(body) - 2, 3)]
        elif kind == b"tRNS":
            alphas = body
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    if header is None:
        raise PNGError("no IHDR")
    width, height, depth, colour, _ = header
    if width * height > _MAX_PIXELS or width == 0 or height == 0:
        raise PNGError("bad size")
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(colour)
    if channels is None or depth not in (1, 2, 4, 8, 16):
        raise PNGError("unsupported colour type")
    try:
        raw = zlib.decompress(bytes(idat))
    except zlib.error as e:
        raise PNGError(str(e)) from e
    bits_per_pixel = channels * depth
    stride = (width * bits_per_pixel + 7) // 8
    bpp = max(1, bits_per_pixel // 8)
    rows = _unfilter(raw, height, stride, bpp)
    pixels: list[tuple[int, int, int, int]] = []
    for row in rows:
        samples = _samples(row, width * channels, depth)
        for x in range(width):
            px = samples[x * channels : (x + 1) * channels]
            pixels.append(_rgba(px, colour, palette, alphas))
    return width, height, pixels


def _unfilter(raw: bytes, height: int, stride: int, bpp: int) -> list[bytes]:
    if len(raw) < height * (stride + 1):
        raise PNGError("truncated image data")
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        line = bytearray(raw[start + 1 : start + 1 + stride])
        if kind == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif kind == 2:
            for i in range(stride):
                line[i] = (line[i] + prev[i]) & 0xFF
        elif kind == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b = prev[i]
                c = prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        elif kind != 0:
            raise PNGError(f"bad filter {kind}")
        rows.append(bytes(line))
        prev = line
    return rows


def _samples(row: bytes, count: int, depth: int) -> list[int]:
    if depth == 8:
        return list(row[:count])
    if depth == 16:
        return [row[i * 2] for i in range(count)]  # the high byte is enough to name a colour
    out: list[int] = []
    per_byte = 8 // depth
    mask = (1 << depth) - 1
    for byte in row:
        for k in range(per_byte):
            out.append((byte >> (8 - depth * (k + 1))) & mask)
    return out[:count]


def _rgba(
    px: list[int],
    colour: int,
    palette: list[tuple[int, int, int]],
    alphas: bytes,
) -> tuple[int, int, int, int]:
    if colour == 3:
        index = px[0]
        if index >= len(palette):
            raise PNGError("palette index out of range")
        r, g, b = palette[index]
        return r, g, b, alphas[index] if index < len(alphas) else 255
    if colour == 0:
        return px[0], px[0], px[0], 255
    if colour == 4:
        return px[0], px[0], px[0], px[1]
    if colour == 2:
        return px[0], px[1], px[2], 255
    return px[0], px[1], px[2], px[3]


def nearest_colour(r: int, g: int, b: int) -> str:
    return min(COLOURS, key=lambda n: sum((c - v) ** 2 for c, v in zip(COLOURS[n], (r, g, b), strict=True)))


def dominant_colour(data: bytes) -> str | None:
    """The name of the commonest colour of a PNG, or None when it cannot be decoded."""
    try:
        _w, _h, pixels = decode_png(data)
    except (PNGError, struct.error, IndexError):
        return None
    step = max(1, len(pixels) // 20_000)
    votes = Counter(nearest_colour(r, g, b) for r, g, b, a in pixels[::step] if a >= 128)
    if not votes:
        return None
    return votes.most_common(1)[0][0]


def encode_png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A solid-colour RGB PNG: used by tests and by whoever needs a probe image."""
    row = b"\x00" + bytes(rgb) * width
    raw = row * height

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return _SIGNATURE + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
