"""The writer's hold while the database is out of reach (proxy/store/held.py): whichever bound is reached
first drops the oldest, and what is said names the bound that was hit (issue 31 item 3: the log blamed the
10,000-exchange bound when the bytes bound had dropped them)."""

from __future__ import annotations

from tapfix.proxy.exchange import Exchange
from tapfix.proxy.store.held import Held


def _exchange(size: int) -> Exchange:
    return Exchange(request=b"x" * size)


def test_the_bytes_bound_is_named_when_it_is_hit() -> None:
    held = Held(max_exchanges=10_000, max_bytes=100)
    dropped = held.add([_exchange(60), _exchange(60), _exchange(60)])
    assert len(dropped) == 2 and len(held) == 1
    why = held.why_full()
    assert "100 bytes" in why and "--store-queue-bytes" in why and "10000" not in why, why


def test_the_exchanges_bound_is_named_when_it_is_hit() -> None:
    held = Held(max_exchanges=2, max_bytes=1 << 30)
    dropped = held.add([_exchange(10) for _ in range(3)])
    assert len(dropped) == 1 and len(held) == 2
    why = held.why_full()
    assert "2 exchanges" in why and "--store-queue" in why and "--store-queue-bytes" not in why, why
