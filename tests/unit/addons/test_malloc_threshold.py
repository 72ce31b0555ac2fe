"""The fixed mmap threshold `tapfix run` sets (addons/runner/master.py) must leave asyncio's socket reads on the
heap: each read allocates the transport's whole read buffer, and below the threshold every read of every chunk
was an mmap, a page fault, an mremap and a munmap (issue 34)."""

from __future__ import annotations

from asyncio import selector_events

from tapfix.addons.runner.master import MMAP_THRESHOLD

MALLOC_HEADER = 16  # glibc's chunk header on 64-bit; a request is rounded up past it


def test_a_socket_read_buffer_stays_below_the_mmap_threshold() -> None:
    assert selector_events._SelectorTransport.max_size + MALLOC_HEADER < MMAP_THRESHOLD


def test_megabyte_bodies_stay_above_it() -> None:
    assert MMAP_THRESHOLD <= 1 << 20  # an agent's megabyte request body is still mmapped, and returned on free
