"""The API surfaces (Chat Completions, legacy Completions, Responses, Messages): one object each, and which
one an exchange speaks. Code elsewhere asks a surface what it is instead of comparing its name."""

from tapfix.proxy.surfaces.base import ApiSurface, Evented, Framing, Surface
from tapfix.proxy.surfaces.chat import CHAT
from tapfix.proxy.surfaces.completions import COMPLETIONS
from tapfix.proxy.surfaces.messages import MESSAGES, anthropic_type
from tapfix.proxy.surfaces.other import OTHER
from tapfix.proxy.surfaces.registry import (
    SURFACES,
    PerSurface,
    api_surface,
    evented_body,
    evented_stream,
    is_inference,
    sniff_body,
    sniff_stream,
    surface_for,
)
from tapfix.proxy.surfaces.responses import RESPONSES

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "MESSAGES",
    "OTHER",
    "RESPONSES",
    "SURFACES",
    "ApiSurface",
    "Evented",
    "Framing",
    "PerSurface",
    "Surface",
    "anthropic_type",
    "api_surface",
    "evented_body",
    "evented_stream",
    "is_inference",
    "sniff_body",
    "sniff_stream",
    "surface_for",
]
