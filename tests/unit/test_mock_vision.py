"""Pure-Python PNG decoding (every filter, colour type and bit depth the mock claims) and token splitting."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tapfix.proxy.mock.chat import split_fragments, split_tokens
from tapfix.proxy.mock.vision import PNGError, decode_png, dominant_colour, encode_png


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def _filter(kind: int, line: bytes, prev: bytes, bpp: int) -> bytes:
    out = bytearray()
    for i, x in enumerate(line):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        pred = [0, a, b, (a + b) >> 1, _paeth(a, b, c)][kind]
        out.append((x - pred) & 0xFF)
    return bytes(out)


def png(
    width: int,
    rows: list[bytes],
    colour: int,
    depth: int = 8,
    plte: bytes = b"",
    trns: bytes = b"",
    filters: tuple[int, ...] = (0, 1, 2, 3, 4),
) -> bytes:
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour]
    bpp = max(1, channels * depth // 8)
    raw = b""
    prev = bytes(len(rows[0]))
    for y, line in enumerate(rows):
        kind = filters[y % len(filters)]
        raw += bytes([kind]) + _filter(kind, line, prev, bpp)
        prev = line

    def png_chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, len(rows), depth, colour, 0, 0, 0)
    extra = (png_chunk(b"PLTE", plte) if plte else b"") + (png_chunk(b"tRNS", trns) if trns else b"")
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + extra
        + png_chunk(b"IDAT", zlib.compress(raw))
        + png_chunk(b"IEND", b"")
    )


def test_rgb_with_every_filter_round_trips() -> None:
    rows = [bytes((x * 37 + y * 11) % 256 for x in range(3 * 7)) for y in range(10)]
    width, height, pixels = decode_png(png(7, rows, colour=2))
    assert (width, height) == (7, 10)
    assert pixels[7 * 3 + 2] == (rows[3][6], rows[3][7], rows[3][8], 255)


def test_rgba_transparent_pixels_do_not_vote() -> None:
    red_opaque = bytes([255, 0, 0, 255]) * 3
    blue_clear = bytes([0, 0, 255, 0]) * 7
    assert dominant_colour(png(10, [red_opaque + blue_clear] * 4, colour=6)) == "red"


def test_palette_with_low_bit_depth() -> None:
    plte = bytes([0, 0, 0, 250, 240, 20])  # index 0 black, 1 yellow
    row = bytes([0b11110111])  # 2-bit indices 3, 3, 1, 3: the palette has only 2 entries
    with pytest.raises(PNGError):
        decode_png(png(4, [row], colour=3, depth=2, plte=plte))
    assert dominant_colour(png(4, [row], colour=3, depth=2, plte=plte)) is None
    row = bytes([0b11111110])  # 1-bit: seven 1s then a 0 (8 pixels)
    assert dominant_colour(png(8, [row] * 3, colour=3, depth=1, plte=plte)) == "yellow"


def test_gray_16_bit_and_gray_alpha() -> None:
    white16 = bytes([0xFF, 0xFE]) * 5
    assert dominant_colour(png(5, [white16] * 5, colour=0, depth=16)) == "white"
    dark = bytes([10, 255]) * 6
    assert dominant_colour(png(6, [dark] * 2, colour=4)) == "black"


@pytest.mark.parametrize("data", [b"", b"GIF89a", encode_png(2, 2, (1, 2, 3))[:40], b"\x89PNG\r\n\x1a\n" + b"\0" * 30])
def test_garbage_is_not_a_colour(data: bytes) -> None:
    assert dominant_colour(data) is None


@given(st.text())
def test_tokens_concatenate_back(text: str) -> None:
    pieces = split_tokens(text)
    assert "".join(pieces) == text
    assert all(pieces) and all(len(p) <= 7 for p in pieces)
    assert "".join(split_fragments(text)) == text


def test_tokens_look_like_words() -> None:
    assert split_tokens("Hello, world! It's fine.") == ["Hello", ",", " world", "!", " It's", " fine", "."]
