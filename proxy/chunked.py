"""HTTP/1.1 chunked framing, read from one chunk boundary to the last chunk (issue 34's body relay).

The body relay (addons/runner/body_relay.py) reads a streamed response's middle itself and gives the
connection back to mitmproxy for its end: so this reader stops, and hands back the bytes from there
on, at the first boundary it won't read past: the last chunk (`0`, its trailers and whatever follows
are mitmproxy's to parse) and a size line that isn't one (mitmproxy reports the protocol error as it
always did). Data is given out as it arrives, a chunk's part at a time, like h11's reader does for
mitmproxy; a chunk extension (`;name=value`) is read and dropped, as h11 does.
"""

from __future__ import annotations

import re

_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}[ \t]*(?:;[^\r\n]*)?")
MAX_SIZE_LINE = 4096  # a size line longer than this is no size line (h11 bounds it the same way)


def frame(data: bytes) -> bytes:
    """`data` as one chunk; nothing for no data (an empty chunk is the body's end)."""
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""


class ChunkedReader:
    """Feed it the body's bytes from a chunk boundary on; it gives the chunks' data and, once it stops,
    the bytes from where it stopped."""

    __slots__ = ("_left", "_crlf", "_line", "stopped")

    def __init__(self) -> None:
        self._left = 0  # data bytes of the current chunk still to come
        self._crlf = 0  # bytes of the CRLF after the current chunk's data still to come
        self._line = b""  # an unfinished size line (all bytes since the last boundary)
        self.stopped = False

    def feed(self, data: bytes) -> tuple[list[bytes], bytes | None]:
        """The chunks' data in `data`, and None while the body goes on; once stopped, the bytes from the
        boundary where it stopped (a last chunk's or a bad size line's first byte) to the end of `data`."""
        if self.stopped:
            return [], data
        out: list[bytes] = []
        pos, end = 0, len(data)
        while pos < end:
            if self._left:
                take = min(self._left, end - pos)
                out.append(data[pos : pos + take])
                self._left -= take
                pos += take
                if not self._left:
                    self._crlf = 2
            elif self._crlf:
                want = b"\r\n"[2 - self._crlf :]
                have = data[pos : pos + len(want)]
                if not want.startswith(have):
                    return self._stop(out, data[pos:])  # a bad chunk footer: mitmproxy's parser says so
                self._crlf -= len(have)
                pos += len(have)
            else:
                newline = data.find(b"\n", pos)
                if newline < 0:
                    self._line += data[pos:]
                    if len(self._line) > MAX_SIZE_LINE:
                        return self._stop(out, self._line)
                    return out, None
                line = self._line + data[pos : newline + 1]
                if not line.endswith(b"\r\n") or not _SIZE.fullmatch(line, 0, len(line) - 2):
                    return self._stop(out, line + data[newline + 1 :])
                size = int(line[: len(line) - 2].split(b";", 1)[0].strip(b" \t"), 16)
                if size == 0:
                    return self._stop(out, line + data[newline + 1 :])
                self._line = b""
                self._left = size
                pos = newline + 1
        return out, None

    def held(self) -> bytes:
        """The bytes since the last boundary not given out as data (an unfinished size line): what a
        reader taking over from here must see first."""
        return self._line

    def inside(self) -> tuple[int, bytes]:
        """Where in a chunk it stands: its data bytes still to come, and the part of its CRLF still due
        (h11's `_bytes_in_chunk` and `_bytes_to_discard`, for a reader taking over mid-chunk)."""
        return self._left, b"\r\n"[2 - self._crlf :] if self._crlf else b""

    def _stop(self, out: list[bytes], rest: bytes) -> tuple[list[bytes], bytes]:
        self.stopped = True
        self._line = b""
        return out, rest
