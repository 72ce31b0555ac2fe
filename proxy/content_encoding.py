"""Incremental decoders for `Content-Encoding` (gzip, deflate, br, zstd), bounded in what they inflate.

tapfix asks upstreams for identity, but some compress anyway; a client may compress its request.
mitmproxy's own decoders take whole bodies, which would turn a stream into one late blob, so the
stream owner feeds these chunk by chunk instead. Every call returns at most what is left of the
limit: a few KB of zstd or brotli can inflate to gigabytes, and checking the size only after a
call would already have allocated them.

`DECODED_LIMIT` (64 MiB) is the most decoded data one body may produce. It matches the request
cap the issue sets, and is far above any real answer (a long reasoning stream is a few MB) while
keeping one exchange's decoded copy a bounded share of memory.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Callable

import brotli

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

DECODED_LIMIT = 64 * 1024 * 1024
CODINGS = ("gzip", "x-gzip", "deflate", "br", "zstd")


class DecodeError(ValueError):
    """The bytes are not what their Content-Encoding says (or the coding is unknown)."""


class DecodedTooLarge(DecodeError):
    """The body inflates past the limit; decoding stopped there."""


def codings(header: str | None) -> list[str]:
    """The codings a Content-Encoding value names, in the order they were applied (identity dropped)."""
    if not header:
        return []
    return [c for c in (p.strip().lower() for p in header.split(",")) if c and c != "identity"]


class _Codec:
    """One coding, streaming: `feed(data, room)` returns at most `room + 1` bytes (one over = too large)."""

    def feed(self, data: bytes, room: int) -> bytes:
        raise NotImplementedError

    def finish(self, room: int) -> bytes:
        return b""

    @property
    def complete(self) -> bool:
        return True


class _Zlib(_Codec):
    def __init__(self, coding: str) -> None:
        self.gzip = coding != "deflate"
        # deflate is zlib-wrapped by the RFC, but some servers send it raw: decided on the first bytes.
        self.wbits = 31 if self.gzip else 15
        self.d = zlib.decompressobj(self.wbits)
        self.started = False

    def feed(self, data: bytes, room: int) -> bytes:
        out = bytearray()
        while data:
            if self.d.eof:  # another gzip member; deflate has one stream only
                if not self.gzip:
                    raise DecodeError("deflate: data after the end of the stream")
                self.d = zlib.decompressobj(self.wbits)
            try:
                out += self.d.decompress(data, room + 1 - len(out))  # never 0 (= unbounded): out <= room here
            except zlib.error as e:
                if self.gzip or self.started:
                    raise DecodeError(f"{'gzip' if self.gzip else 'deflate'}: {e}") from e
                self.wbits, self.d, self.started = -15, zlib.decompressobj(-15), True  # raw deflate
                continue
            self.started = True
            if len(out) > room:
                raise DecodedTooLarge(f"decodes to more than the limit ({room} bytes left)")
            data = self.d.unused_data if self.d.eof else self.d.unconsumed_tail
        return bytes(out)

    def finish(self, room: int) -> bytes:
        return self.d.flush()[: room + 1]

    @property
    def complete(self) -> bool:
        return self.d.eof


class _Brotli(_Codec):
    def __init__(self) -> None:
        self.d = brotli.Decompressor()

    def feed(self, data: bytes, room: int) -> bytes:
        try:
            out: bytes = self.d.process(data, output_buffer_limit=room + 1)
            while len(out) <= room and not self.d.can_accept_more_data():
                more = self.d.process(b"", output_buffer_limit=room + 1 - len(out))
                if not more:
                    break
                out += more
        except brotli.error as e:
            raise DecodeError(f"br: {e}") from e
        if len(out) > room:
            raise DecodedTooLarge(f"decodes to more than the limit ({room} bytes left)")
        return out

    @property
    def complete(self) -> bool:
        return bool(self.d.is_finished())


class _Zstd(_Codec):
    def __init__(self) -> None:
        self.d = zstd.ZstdDecompressor()

    def feed(self, data: bytes, room: int) -> bytes:
        out = bytearray()
        try:
            while True:
                if self.d.eof:  # a further frame, started only when bytes for it arrive
                    if not data:
                        break
                    self.d = zstd.ZstdDecompressor()
                out += self.d.decompress(data, room + 1 - len(out))
                if len(out) > room:
                    raise DecodedTooLarge(f"decodes to more than the limit ({room} bytes left)")
                if self.d.eof:
                    data = self.d.unused_data
                elif self.d.needs_input:
                    break
                else:
                    data = b""  # more output is pending: ask for it with no new input
        except zstd.ZstdError as e:
            raise DecodeError(f"zstd: {e}") from e
        return bytes(out)

    @property
    def complete(self) -> bool:
        return bool(self.d.eof)


_CODECS: dict[str, Callable[[], _Codec]] = {
    "gzip": lambda: _Zlib("gzip"),
    "x-gzip": lambda: _Zlib("gzip"),
    "deflate": lambda: _Zlib("deflate"),
    "br": _Brotli,
    "zstd": _Zstd,
}


class Decoder:
    """`feed(chunk) -> bytes` then `finish() -> bytes`; raises DecodeError (DecodedTooLarge past `limit`).

    Several codings (`gzip, br`) are undone last-applied first, each bounded by the same limit."""

    def __init__(self, header: str, limit: int = DECODED_LIMIT) -> None:
        names = codings(header)
        unknown = [n for n in names if n not in _CODECS]
        if unknown or not names:
            raise DecodeError(f"unsupported Content-Encoding {header!r}")
        self.header = header.strip()
        self.limit = limit
        self.total = 0  # decoded bytes produced so far
        self._chain = [_CODECS[n]() for n in reversed(names)]

    def feed(self, data: bytes) -> bytes:
        for codec in self._chain:
            if not data:
                return b""
            data = codec.feed(data, self.limit - self.total)
        self.total += len(data)
        return data

    def finish(self, *, strict: bool = False) -> bytes:
        """What the decoders still hold. `strict`: a body cut short (no end marker) is an error."""
        out = b""
        for i, codec in enumerate(self._chain):
            tail = codec.finish(self.limit - self.total)
            for later in self._chain[i + 1 :]:
                tail = later.feed(tail, self.limit - self.total) if tail else b""
            out += tail
            if strict and not codec.complete:
                raise DecodeError(f"{self.header}: the body ends before the compressed stream does")
        if self.total + len(out) > self.limit:
            raise DecodedTooLarge("decodes to more than the limit")
        self.total += len(out)
        return out


def decode_whole(body: bytes, header: str, limit: int = DECODED_LIMIT) -> bytes:
    """A whole body decoded; raises DecodeError when any of it can't be (a truncated one included)."""
    decoder = Decoder(header, limit)
    return decoder.feed(body) + decoder.finish(strict=True)
