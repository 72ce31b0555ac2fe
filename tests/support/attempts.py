"""Feed a spliced pipeline (proxy/response/pipeline.py) its attempts as the stream owner does (issue 19):
attempt 1 as mitmproxy hands it over (reads, then b"" at its end, where the splice decides), then each
later attempt the splice asked for through `feed_attempt`, then its end."""

from __future__ import annotations

import random

from tapfix.proxy.response.pipeline import StreamPipeline

from tests.support.builders import random_splits


def _listed(got: bytes | list[bytes]) -> list[bytes]:
    return [got] if isinstance(got, bytes) else got


def through_attempts(pipeline: StreamPipeline, attempts: list[bytes], seed: int, last_cut: bool = False) -> bytes:
    """What the client gets. An attempt the splice didn't ask for is not sent. `last_cut`: the last later
    attempt broke off (no decision at its end: what the stages hold and a deferred error go out)."""
    rng = random.Random(seed)
    first, *later = attempts
    out: list[bytes] = []
    for piece in random_splits(first, rng):
        out += _listed(pipeline(piece))
    out += _listed(pipeline(b""))
    for i, data in enumerate(later):
        if not pipeline.pending:
            break
        for piece in random_splits(data, rng) if data else []:
            out += pipeline.feed_attempt(piece)
        if last_cut and i == len(later) - 1:
            pipeline.close_splice()
            pipeline.cut = True
        out += pipeline.end_of_attempt()
    return b"".join(out)
