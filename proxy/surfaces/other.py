"""A path that names no surface (`/v1/models`, embeddings, health): forwarded untouched; tapfix's own
errors on it are OpenAI-shaped."""

from __future__ import annotations

from tapfix.proxy.surfaces.base import ApiSurface

OTHER = ApiSurface(name="other")
