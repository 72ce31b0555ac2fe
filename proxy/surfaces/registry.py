"""The registered surfaces, which one an exchange speaks (from its request path, a stream's first bytes,
or a body), and `PerSurface`, the typed table a higher layer keeps of its part of each surface.

Every stage that reads or rewrites a body needs to know the wire format, and they must agree: the
router fills sampling per surface, the stream owner picks the repair stage, the writer assembles and
flags, all by the same answer. The request path decides when it names a surface; the bytes decide
only when no path is known (a stored body, a replayed one) or the path names none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, cast

from tapfix.proxy.surfaces.base import ApiSurface, Evented, Surface
from tapfix.proxy.surfaces.chat import CHAT
from tapfix.proxy.surfaces.completions import COMPLETIONS
from tapfix.proxy.surfaces.messages import MESSAGES
from tapfix.proxy.surfaces.other import OTHER
from tapfix.proxy.surfaces.responses import RESPONSES

SURFACES: tuple[ApiSurface, ...] = (CHAT, COMPLETIONS, RESPONSES, MESSAGES)
_BY_NAME = {s.name: s for s in SURFACES}
_BY_PATH = {s.path: s for s in SURFACES}
_PATH = re.compile(r"(?:^|/)(" + "|".join(re.escape(s.path or "") for s in SURFACES) + r")/?$")
_SNIFF_BYTES = 4096


def api_surface(name: str | None) -> ApiSurface:
    """The surface object of a name (`surface_for`'s answer, the store's column); `OTHER` for None or a
    name no surface has ("other")."""
    return OTHER if name is None else _BY_NAME.get(name, OTHER)


def _name(surface: ApiSurface) -> Surface:
    return cast(Surface, surface.name)  # every registered surface's name is a Surface


def surface_for(path: str) -> Surface | None:
    """Which API a request path is, with or without `/v1` and with any prefix before it."""
    m = _PATH.search(path.split("?", 1)[0])
    return _name(_BY_PATH[m.group(1)]) if m else None


def is_inference(path: str) -> bool:
    """A request to one of the surfaces (not `/v1/models`, embeddings, health, ...)."""
    return surface_for(path) is not None


def sniff_stream(head: bytes) -> Evented | None:
    """`responses` or `messages` from the first bytes of an SSE stream or JSON body, else None."""
    head = head[:_SNIFF_BYTES]
    if b"event: response." in head or b'"type":"response.' in head or b'"type": "response.' in head:
        return "responses"
    for marker in (b"message_start", b"content_block_start"):
        if b"event: " + marker in head or b'"type":"' + marker in head or b'"type": "' + marker in head:
            return "messages"
    return None


def sniff_body(obj: Any) -> Evented | None:
    """`responses` or `messages` from a parsed response body, else None (chat-shaped or unknown)."""
    if not isinstance(obj, dict):
        return None
    if obj.get("object") == "response":
        return "responses"
    if obj.get("type") == "message" and isinstance(obj.get("content"), list):
        return "messages"
    return None


def _evented(name: Surface | None) -> Evented | None:
    return cast(Evented, name) if name is not None and api_surface(name).evented else None


def evented_stream(path: str | None, head: bytes) -> Evented | None:
    """The evented surface of a response stream, None when it is chat-shaped (chat, legacy completions).

    A path that names a surface decides; without one, the stream's first bytes do.
    """
    if path is not None:
        surface = surface_for(path)
        if surface is not None:
            return _evented(surface)
    return sniff_stream(head)


def evented_body(path: str | None, obj: Any) -> Evented | None:
    """The evented surface of a parsed response body, None when it is chat-shaped.

    A Responses or Messages path decides; otherwise (a chat path too) the body's own shape does.
    """
    if path is not None and (evented := _evented(surface_for(path))) is not None:
        return evented
    return sniff_body(obj)


class PerSurface[T]:
    """What one layer above keeps of each surface (its assembler, its tool-call stage, its body repair):
    the layer that owns the part fills the table from its own modules, keyed by the surface objects, so a
    lookup is typed and the table is whole as soon as it can be imported (no registration at import time
    that depends on which modules happened to load)."""

    def __init__(self, parts: Mapping[ApiSurface, T]) -> None:
        self._parts = {surface.name: part for surface, part in parts.items()}

    def get(self, surface: Surface | ApiSurface | None) -> T | None:
        """The part for a surface (by object or by name); None for a surface that has none."""
        if surface is None:
            return None
        return self._parts.get(surface if isinstance(surface, str) else surface.name)

    def __getitem__(self, surface: Surface | ApiSurface) -> T:
        part = self.get(surface)
        if part is None:
            raise KeyError(str(surface))
        return part

    def surfaces(self) -> tuple[ApiSurface, ...]:
        """The surfaces that have a part, in registration order."""
        return tuple(s for s in SURFACES if s.name in self._parts)
